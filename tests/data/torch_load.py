#!/usr/bin/env python3
"""Loads a pipetrain checkpoint into the equivalent torch.nn.Sequential with
strict=True (test_model's MLP: Linear(8,16), ReLU, Linear(16,3)). Reads the
safetensors file with the standard library, so the safetensors package is not
needed. Exit 0 on success."""
import json
import struct
import sys

import torch
import torch.nn as nn

path = sys.argv[1]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
state = {}
for name, info in header.items():
    if name == "__metadata__":
        continue
    assert info["dtype"] == "F32", info
    b, e = info["data_offsets"]
    t = torch.frombuffer(bytearray(data[b:e]), dtype=torch.float32)
    state[name] = t.reshape(info["shape"])
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
model.load_state_dict(state, strict=True)
out = model(torch.zeros(2, 8))
assert out.shape == (2, 3)
print("torch: loaded", len(state), "tensors, step", header["__metadata__"]["step"])
