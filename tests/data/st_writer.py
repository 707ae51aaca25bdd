#!/usr/bin/python3
"""st_writer.py - an independent .safetensors writer for tests (standard library only).

Writes the tensors below to argv[1] the way the reference implementation lays a
file out: 8-byte little-endian header length, JSON header (keys sorted, padded
with spaces to a multiple of 8), data. The data order differs from the header
order on purpose, and the 3-byte U8 tensor first leaves the F32 data after it
unaligned. test_safetensors.c checks every value exactly.
"""
import json
import struct
import sys

# name -> (dtype, shape, struct format, values); written in this order.
TENSORS = [
    ("mask", "U8", [3], "<3B", [0, 255, 7]),
    ("0.weight", "F32", [2, 3], "<6f", [0.5, -1.25, 3.0, 0.001, -0.0, 65504.0]),
    ("0.bias", "F32", [2], "<2f", [1.0, -2.0]),
    ("half", "F16", [2], "<2e", [1.5, -0.25]),
    ("brain", "BF16", [3], "<3H", [0x3F80, 0xC000, 0x4049]),
    ("double", "F64", [2], "<2d", [3.141592653589793, -1e300]),
    ("int32", "I32", [2], "<2i", [-7, 2147483647]),
    ("int64", "I64", [2], "<2q", [-9007199254740993, 9223372036854775807]),
    ("uint16", "U16", [2], "<2H", [65535, 1]),
    ("uint32", "U32", [1], "<1I", [4294967295]),
    ("scalar", "F32", [], "<1f", [42.0]),
    ("empty", "F32", [0, 3], "<0f", []),
]


def main():
    header = {"__metadata__": {"format": "pt", "source": "st_writer.py"}}
    data = b""
    for name, dtype, shape, fmt, values in TENSORS:
        raw = struct.pack(fmt, *values)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, sort_keys=True).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(sys.argv[1], "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


if __name__ == "__main__":
    main()
