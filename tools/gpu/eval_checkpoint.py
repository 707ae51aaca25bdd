#!/usr/bin/env python3
"""eval_checkpoint.py JOB CKPT STATUS_JSON ROOT - a checkpoint fetched from a
job trained on a GPU, evaluated on the CPU with pipetrain.torch (float64),
against the held-out loss and accuracy the server reported for the same
weights (`pipeclient status JOB --json`, "last"). Exit 0 when the loss agrees
within 1e-4 relative and the accuracy within 2 rows (tokens) of the set: the
server computes in float32 on the GPU, in another reduction order."""
import json
import sys

import torch

import pipetrain.torch as ptt

job, ckpt, status, root = sys.argv[1:5]
with open(status) as f:
    last = json.load(f)["last"]
model = ptt.build_model(job)
model.load_state_dict(ptt.load_safetensors(ckpt), strict=True)
x, y = ptt.held_out(job, root)
loss, acc = ptt.evaluate(model, job, x, y)
rows = x.shape[0] * (x.shape[1] if x.dtype == torch.int64 and x.dim() == 2 else 1)
ok = abs(loss - last["eval_loss"]) <= 1e-4 * abs(last["eval_loss"]) and \
    abs(acc - last["eval_accuracy"]) <= 2.0 / rows
print(f"{job}: step {last['step']}: server (GPU) eval loss {last['eval_loss']:.6f} "
      f"accuracy {last['eval_accuracy']:.4f}; PyTorch (CPU, float64) {loss:.6f} {acc:.4f} "
      f"over {x.shape[0]} rows: {'agree' if ok else 'DISAGREE'}")
sys.exit(0 if ok else 1)
