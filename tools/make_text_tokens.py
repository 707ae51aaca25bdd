#!/usr/bin/python3
"""make_text_tokens.py - byte-level tokens of a text file as raw little-endian uint16.

Each byte of the input is one token (vocabulary 256). The output is what
pt_tokens_load(path, PT_U16, 256) reads and what pt_tokens_write_bytes writes.
Standard library only. Run from the repository root:
    /usr/bin/python3 tools/make_text_tokens.py [examples/data/text.txt [examples/data/text.u16]]
"""
import array
import sys


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "examples/data/text.txt"
    dst = sys.argv[2] if len(sys.argv) > 2 else "examples/data/text.u16"
    with open(src, "rb") as f:
        data = f.read()
    tokens = array.array("H", list(data))  # one token per byte
    if sys.byteorder != "little":
        tokens.byteswap()
    with open(dst, "wb") as f:
        tokens.tofile(f)
    print("wrote %d tokens to %s" % (len(tokens), dst))


if __name__ == "__main__":
    main()
