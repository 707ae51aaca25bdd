#!/bin/sh
# make_text.sh - build examples/data/text.txt, the English corpus of the
# byte-level language model examples.
#
# Provenance and terms: the text is the verbatim, unmodified concatenation of
# the Free Software Foundation's license documents shipped by Debian's
# base-files package in /usr/share/common-licenses (GPL-1, GPL-2, GPL-3,
# LGPL-2, LGPL-2.1, LGPL-3, GFDL-1.2, GFDL-1.3). Each says "Everyone is
# permitted to copy and distribute verbatim copies of this license document,
# but changing it is not allowed", which is all we do: the files are copied
# whole, in this order, with nothing added or changed.
#
# Run from the repository root: sh tools/make_text.sh
set -eu
src=/usr/share/common-licenses
out=examples/data/text.txt
cat "$src/GPL-1" "$src/GPL-2" "$src/GPL-3" "$src/LGPL-2" "$src/LGPL-2.1" \
    "$src/LGPL-3" "$src/GFDL-1.2" "$src/GFDL-1.3" > "$out"
wc -c "$out"
