#!/usr/bin/env python3
"""embed_file.py IN OUT SYMBOL - write a C file defining IN's bytes as
`const unsigned char SYMBOL[]` (NUL-terminated) and `const size_t SYMBOL_len`.
Run by the build (server/meson.build); its output goes to the build folder."""
import sys

src, dst, sym = sys.argv[1:4]
data = open(src, 'rb').read()
lines = ['/* Generated from %s by tools/embed_file.py: do not edit. */' % src.split('/')[-1],
         '#include <stddef.h>', '',
         'const unsigned char %s[] = {' % sym]
for i in range(0, len(data), 16):
    lines.append('\t' + ', '.join('0x%02x' % b for b in data[i:i + 16]) + ',')
lines += ['\t0x00,', '};', 'const size_t %s_len = %d;' % (sym, len(data)), '']
with open(dst, 'w') as f:
    f.write('\n'.join(lines))
