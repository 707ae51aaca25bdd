#!/usr/bin/env python3
"""PyTorch reference for pt-bench's W1 and W2 workloads (same shapes, AdamW,
same thread count). Prints `torch <name> <value>` lines. Run with
OMP_WAIT_POLICY=PASSIVE (PyTorch's best setting on this machine)."""
import math
import os
import sys
import time

import torch
import torch.nn as nn

threads = int(os.environ.get("PIPETRAIN_THREADS", os.cpu_count()))
torch.set_num_threads(threads)
torch.manual_seed(1)


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.h)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.fc2(nn.functional.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, d=256, h=4, n=8, T=128):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(256, d), nn.Embedding(T, d)
        self.blocks = nn.Sequential(*[Block(d, h) for _ in range(n)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 256)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def run(model, x, y, warmup, steps, flat, bf16=False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lossf = nn.CrossEntropyLoss()
    for s in range(warmup + steps):
        if s == warmup:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        # bf16: autocast, PyTorch's mixed precision (f32 master weights).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        loss = lossf(out.float().view(-1, out.shape[-1]) if flat else out.float(),
                     y.view(-1) if flat else y)
        loss.backward()
        opt.step()
    return x.shape[0] * steps / (time.perf_counter() - t0)


w1 = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                   nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
s1 = run(w1, torch.randn(256, 64), torch.randint(0, 10, (256,)), 30, 300, False)
print(f"torch w1_samples_per_s {s1:.0f}")
s2 = run(GPT(), torch.randint(0, 256, (16, 128)), torch.randint(0, 256, (16, 128)), 2, 8, True)
print(f"torch w2_tokens_per_s {s2 * 128:.0f}")
# autocast bf16 only where the CPU computes bf16 natively: PyTorch's path
# without AVX512_BF16 or AMX took over 5 minutes for these 10 steps.
flags = open("/proc/cpuinfo").read().split()
if "avx512_bf16" in flags or "amx_bf16" in flags:
    s2b = run(GPT(), torch.randint(0, 256, (16, 128)), torch.randint(0, 256, (16, 128)), 2, 8,
              True, bf16=True)
    print(f"torch w2_bf16_tokens_per_s {s2b * 128:.0f}")
else:
    print("# torch w2_bf16 skipped: no AVX512_BF16 or AMX-BF16 on this CPU")
sys.stdout.flush()
