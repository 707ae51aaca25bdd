#!/usr/bin/python3
"""make_digits.py - write examples/data/digits_{x,y}.npy from the UCI optdigits data.

Source: the 8x8 handwritten digits (UCI ML repository "Optical Recognition of
Handwritten Digits", test set, 1797 images) as packaged by Debian's
python3-sklearn in /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz:
one image per line, 64 pixel counts 0..16 then the label 0..9.

Output: digits_x.npy (1797, 64) float32 = pixels / 16, digits_y.npy (1797,) int64.
Run from the repository root: /usr/bin/python3 tools/make_digits.py [csv.gz] [outdir]
"""
import gzip
import sys

import numpy as np

SRC = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else SRC
    out = sys.argv[2] if len(sys.argv) > 2 else "examples/data"
    with gzip.open(src, "rt") as f:
        rows = [[int(v) for v in line.split(",")] for line in f if line.strip()]
    data = np.array(rows, dtype=np.int64)
    assert data.shape == (1797, 65), data.shape
    pixels, labels = data[:, :64], data[:, 64]
    assert pixels.min() >= 0 and pixels.max() <= 16 and set(labels) == set(range(10))
    np.save(out + "/digits_x.npy", (pixels / 16.0).astype("<f4"))
    np.save(out + "/digits_y.npy", labels.astype("<i8"))
    print("wrote %d digits, label sum %d" % (len(labels), int(labels.sum())))


if __name__ == "__main__":
    main()
