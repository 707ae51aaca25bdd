#!/usr/bin/env python3
"""PyTorch reference for w3_bench: the GPT-2-small shape (vocab 50304, d 768,
12 blocks, 12 heads, context 256, batch 8, AdamW; learned positions, pre-LN
blocks, tanh GELU, untied head with bias, as pipetrain's model) on the CPU,
eager, all cores. Prints `torch <name> <value>` lines: w3_step_s (median of
the steps after the first), w3_tokens_per_s, w3_first_step_s (from building
the model to the first step's end, less one step, as w3_bench measures its
own; not comparable with it: glibc gives the large buffers back after each
step, so every step faults its pages in again inside its step time) and
w3_rss_gb (peak RSS); then,
where the CPU computes bf16 natively (AVX512_BF16, AMX), the same model under
torch.autocast bfloat16 (f32 master weights): w3_bf16_step_s and
w3_bf16_tokens_per_s."""
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, D, L, H, T, B, STEPS = 50304, 768, 12, 12, 256, 8, 4
torch.set_num_threads(int(os.environ.get("PIPETRAIN_THREADS", os.cpu_count())))
torch.manual_seed(1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // H)
        y = att.masked_fill(self.mask, float("-inf")).softmax(-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.Sequential(*[Block() for _ in range(L)])
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def train(model, steps, bf16):
    """Times `steps` steps; returns the median of those after the first and
    the time at the first one's end."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    i = torch.arange(B * T)
    x, y = ((i * 31) % 256).view(B, T), ((i * 17) % 256).view(B, T)
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if s == 0:
            first_end = time.perf_counter()
    return statistics.median(times[1:]), first_end


start = time.perf_counter()
step, first_end = train(GPT(), STEPS, False)
print(f"torch w3_step_s {step:.3f}")
print(f"torch w3_tokens_per_s {B * T / step:.1f}")
print(f"torch w3_first_step_s {first_end - start - step:.2f}")
print(f"torch w3_rss_gb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1048576:.2f}")
sys.stdout.flush()
flags = open("/proc/cpuinfo").read().split()
if "avx512_bf16" in flags or "amx_bf16" in flags:
    step, _ = train(GPT(), STEPS, True)
    print(f"torch w3_bf16_step_s {step:.3f}")
    print(f"torch w3_bf16_tokens_per_s {B * T / step:.1f}")
else:
    print("# torch w3_bf16 skipped: no AVX512_BF16 or AMX-BF16 on this CPU")
sys.stdout.flush()
