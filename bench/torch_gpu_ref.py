#!/usr/bin/env python3
"""PyTorch reference for gpu_bench's GPT-2-small step on cuda:0: the same
model as pipetrain's (learned positions, pre-LN blocks, tanh GELU, untied
head with bias), vocab 50304, d 768, 12 blocks, 12 heads, context 1024,
batch 8, AdamW, eager. Prints `torch <name> <value>` lines:
  gpu_w2_tokens_per_s_fp32   FP32, TF32 off, attention written out (as ours)
  gpu_w2_tokens_per_s_tf32   TF32 matmuls, attention written out
  gpu_w2_tokens_per_s_sdpa   TF32 and fused attention (what users write)
  gpu_w2_tokens_per_s_bf16   torch.autocast(bfloat16), attention written out
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, D, L, H, T, B = 50304, 768, 12, 12, 1024, 8
dev = torch.device("cuda:0")


class Block(nn.Module):
    def __init__(self, fused):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.fused = fused
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // H)
            y = att.masked_fill(self.mask, float("-inf")).softmax(-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, fused):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.Sequential(*[Block(fused) for _ in range(L)])
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def run(tf32, fused, bf16=False, warmup=2, steps=6):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1)
    model = GPT(fused).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    i = torch.arange(B * T, device=dev)
    x, y = ((i * 31) % V).view(B, T), ((i * 17) % V).view(B, T)
    for s in range(warmup + steps):
        if s == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).view(-1, V).float(), y.view(-1))
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    tps = B * T * steps / (time.perf_counter() - t0)
    del model, opt
    torch.cuda.empty_cache()
    return tps, float(loss)


for name, tf32, fused, bf16 in (("fp32", False, False, False), ("tf32", True, False, False),
                                ("sdpa", True, True, False), ("bf16", False, False, True)):
    tps, loss = run(tf32, fused, bf16)
    print(f"torch gpu_w2_tokens_per_s_{name} {tps:.0f}  (last loss {loss:.4f})")
    sys.stdout.flush()
