"""pipetrain.torch - a job's model as a PyTorch module, and its data.

    import pipetrain.torch as ptt
    model = ptt.build_model("examples/gpt.json")
    model.load_state_dict(ptt.load_safetensors("step-300.safetensors"))
    ptt.save_safetensors(model.state_dict(), "mine.safetensors")  # for init_from

build_model(job) gives an nn.Sequential whose state_dict names and shapes are
those of the job's checkpoints ("0.weight", "1.attn.c_attn.weight", ...), so
any checkpoint of the job loads with load_state_dict(strict=True), and a
file written from it is accepted by a job's `init_from`. The maths of every
layer is docs/model.md's; in eval mode the module computes what the server
computes (to float rounding). Dropout masks while training are PyTorch's, not
the server's (those come from Philox per step, microbatch and layer).

held_out(job, root) and batch(job, step, root) rebuild, with the server's
generator (Philox4x32-10), the evaluation set and the training batch of a
step exactly as the server's runner draws them (lib/job/runner.c), and
evaluate() reduces losses as the server evaluates (the mean over every
counted target of the set). Reads safetensors files without the `safetensors` package (used when
installed).
"""
import copy
import json
import math
import os
import struct

import torch
from torch import nn
import torch.nn.functional as F

__all__ = ["build_model", "load_safetensors", "save_safetensors", "held_out", "batch",
           "evaluate", "loss_fn", "job_dict", "philox"]

# ------------------------------------------------------------------ job --

_KINDS = ["Linear", "ReLU", "GELU", "Tanh", "Sigmoid", "Dropout", "LayerNorm", "Embedding",
          "Attention", "TransformerBlock", "Softmax"]
_FORMATS = ["Npy", "Tokens16", "Tokens32", "Auto"]
_LOSSES = ["CrossEntropy", "MSE"]


def _name(value, names, what):
    if isinstance(value, str):
        if value not in names:
            raise ValueError(f"{what}: unknown value '{value}' (one of {', '.join(names)})")
        return value
    if not isinstance(value, int) or not 0 <= value < len(names):
        raise ValueError(f"{what}: unknown value {value!r}")
    return names[value]


def job_dict(job):
    """The job as a dict in the JSON form of schema/job.fbs's JobSpec: job
    itself when it is a dict, else the job file at that path (JSON as flatc
    reads it, or a FlatBuffers binary; read with pipetrain's own reader)."""
    if isinstance(job, dict):
        return job
    import flatbuffers
    from . import _convert
    from .client import load_job
    # Through the binary form, so every field comes typed (numbers in quotes,
    # enums by number) exactly as the server would read it.
    b = flatbuffers.Builder(0)
    b.Finish(load_job(job).Pack(b))
    root = _convert.module("JobSpec").JobSpec.GetRootAs(b.Output(), 0)
    return _convert.to_dict("JobSpec", root)


# --------------------------------------------------------------- layers --

class Embedding(nn.Module):
    """Token embedding wte (vocab, dim) plus, with max_seq > 0, a learned
    position embedding wpe (max_seq, dim): y[b, t] = wte[x[b, t]] + wpe[t]."""

    def __init__(self, vocab, dim, max_seq=0):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_seq, dim) if max_seq > 0 else None

    def forward(self, x):
        y = self.wte(x)
        if self.wpe is not None:
            y = y + self.wpe(torch.arange(x.shape[-1], device=x.device))
        return y


class Attention(nn.Module):
    """Causal multi-head self-attention: qkv = c_attn(x) packed q | k | v
    along the last dim, head h uses columns [h*hs, (h+1)*hs) of each, scores
    q k^T / sqrt(hs) with j > i masked, softmax, times v, heads concatenated,
    then c_proj."""

    def __init__(self, dim, n_head):
        super().__init__()
        if n_head <= 0 or dim % n_head:
            raise ValueError(f"attention: {n_head} heads do not divide dim {dim}")
        self.n_head = n_head
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    """c_fc, GELU (tanh approximation), c_proj."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.c_fc = nn.Linear(dim, hidden)
        self.c_proj = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class TransformerBlock(nn.Module):
    """Pre-norm GPT-2 block: r = x + attn(ln_1(x)); y = r + mlp(ln_2(r))."""

    def __init__(self, dim, n_head, mlp_hidden=0, eps=0.0):
        super().__init__()
        eps = eps if eps > 0 else 1e-5
        self.ln_1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, n_head)
        self.ln_2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, mlp_hidden if mlp_hidden > 0 else 4 * dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _layer(i, d):
    kind = _name(d.get("kind", 0), _KINDS, f"model[{i}].kind")
    if kind == "Linear":
        return nn.Linear(d["in_features"], d["out_features"], bias=d.get("bias", True))
    if kind == "ReLU":
        return nn.ReLU()
    if kind == "GELU":
        return nn.GELU(approximate="tanh")
    if kind == "Tanh":
        return nn.Tanh()
    if kind == "Sigmoid":
        return nn.Sigmoid()
    if kind == "Dropout":
        return nn.Dropout(d.get("p", 0.0))
    if kind == "Softmax":
        return nn.Softmax(dim=-1)
    if kind == "LayerNorm":
        eps = d.get("eps", 0.0)
        return nn.LayerNorm(d["dim"], eps=eps if eps > 0 else 1e-5)
    if kind == "Embedding":
        return Embedding(d["vocab"], d["dim"], d.get("max_seq", 0))
    if kind == "Attention":
        return Attention(d["dim"], d["n_head"])
    return TransformerBlock(d["dim"], d["n_head"], d.get("mlp_hidden", 0), d.get("eps", 0.0))


def build_model(job):
    """An nn.Sequential of the job's layers (job: a JobSpec dict or a job
    file's path), named and shaped as the job's checkpoints: layer i's
    parameters are "i.<name>" (docs/model.md). Weights are PyTorch's
    defaults, not the server's seeded ones: load a checkpoint to use it."""
    spec = job_dict(job)
    layers = spec.get("model") or []
    if not layers:
        raise ValueError("model: no layers")
    return nn.Sequential(*[_layer(i, d) for i, d in enumerate(layers)])


# ---------------------------------------------------------- safetensors --

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F64": torch.float64, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
           "I16": torch.int16, "I8": torch.int8, "BOOL": torch.bool}
_NAMES = {v: k for k, v in _DTYPES.items()}


def load_safetensors(path):
    """The tensors of a safetensors file as {name: CPU tensor}, in file order."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        pass
    else:
        return load_file(os.fspath(path))
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: truncated safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor '{name}': dtype {e['dtype']} not supported")
        lo, hi = e["data_offsets"]
        dt = _DTYPES[e["dtype"]]
        shape = e["shape"]
        raw = bytearray(body[lo:hi])
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = t.reshape(shape)
    return out


def save_safetensors(tensors, path, metadata=None):
    """Writes {name: tensor} (a state_dict) as a safetensors file, as
    safetensors.torch.save_file does (contiguous little-endian data in the
    order given, header padded with spaces to a multiple of 8)."""
    header, chunks, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor '{name}': dtype {t.dtype} not supported")
        raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = os.fspath(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


# ----------------------------------------------------------------- data --

_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_U32 = 0xFFFFFFFF
_SPLIT_STREAM = 0x73706C6974000000  # "split" (lib/data/batch.h)
_LLMC_MAGIC = 20240520              # llm.c's token file header (lib/data/tokens.h)


def philox(seed, stream, counter):
    """Philox4x32-10 as lib/core/rng.c: four 32-bit words of block `counter`
    of (seed, stream)."""
    c0, c1 = counter & _U32, (counter >> 32) & _U32
    c2, c3 = stream & _U32, (stream >> 32) & _U32
    k0, k1 = seed & _U32, (seed >> 32) & _U32
    for _ in range(10):
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _U32, p1 & _U32, \
            ((p0 >> 32) ^ c3 ^ k1) & _U32, p0 & _U32
        k0 = (k0 + _W0) & _U32
        k1 = (k1 + _W1) & _U32
    return c0, c1, c2, c3


def _shuffle(n, seed, stream):
    """pt_shuffle_indices: Fisher-Yates with 64-bit Philox draws, rejection
    below 2^64 mod bound."""
    perm = list(range(n))
    counter = 0
    for i in range(n - 1, 0, -1):
        bound = i + 1
        reject_below = (1 << 64) % bound
        while True:
            w = philox(seed, stream, counter)
            counter += 1
            r = (w[1] << 32) | w[0]
            if r >= reject_below:
                break
        j = r % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _seed(spec):
    return int(spec.get("seed", 1)) & ((1 << 64) - 1)


def _micro(spec):
    return int(spec["batch_size"]) // int(spec.get("microbatches", 1))


def _path(root, p):
    return p if root is None or os.path.isabs(p) else os.path.join(root, p)


def _npy(spec, root):
    import numpy as np
    d = spec["data"]
    x = np.load(_path(root, d["features"]))
    y = np.load(_path(root, d["labels"]))
    x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    y = torch.from_numpy(np.ascontiguousarray(
        y, dtype=np.int64 if y.ndim == 1 else np.float32))
    return x, y


def _split(spec, n):
    # held_out is a float in the schema: the server computes with its f32 value.
    frac = struct.unpack("<f", struct.pack("<f", spec["data"].get("held_out", 0.2)))[0]
    n_held = math.floor(frac * n)
    perm = _shuffle(n, _seed(spec), _SPLIT_STREAM)
    return perm[:n - n_held], perm[n - n_held:]


def _token_file(spec, root, path):
    """The tokens of a token file as the server reads it: an llm.c .bin
    (256 int32 header: magic 20240520, version 1 uint16 / 2 uint32, count)
    or raw tokens (uint16 for Tokens16 and Auto, uint32 for Tokens32)."""
    import numpy as np
    fmt = _name(spec["data"].get("format", 0), _FORMATS, "data.format")
    raw = np.fromfile(_path(root, path), dtype=np.uint8)
    if raw.size >= 4 and int(raw[:4].view("<i4")[0]) == _LLMC_MAGIC:
        head = raw[:1024].view("<i4")
        dt = "<u2" if int(head[1]) == 1 else "<u4"
        return raw[1024:].view(dt)[:int(head[2])]
    return raw.view("<u4" if fmt == "Tokens32" else "<u2")


def _tokens(spec, root):
    """(tokens, train_end, eval tokens, eval start): training windows lie in
    tokens[:train_end], evaluation windows start at eval start of eval tokens
    (the held-out end of data.tokens, or data.val_tokens from its start)."""
    d = spec["data"]
    tokens = _token_file(spec, root, d["tokens"])
    if d.get("val_tokens"):
        return tokens, len(tokens), _token_file(spec, root, d["val_tokens"]), 0
    # held_out is a float in the schema: the server computes with its f32 value.
    frac = struct.unpack("<f", struct.pack("<f", d.get("held_out", 0.2)))[0]
    split = len(tokens) - math.floor(frac * len(tokens))
    return tokens, split, tokens, split


def _windows(tokens, end, seq_len, seed, stream, n):
    starts = end - seq_len
    offs = []
    for b in range(n):
        w = philox(seed, stream, b)
        offs.append(((w[1] << 32) | w[0]) % starts)
    idx = torch.tensor(offs, dtype=torch.int64)[:, None] + torch.arange(seq_len + 1)
    win = torch.from_numpy(tokens.astype("int64"))[idx]
    return win[:, :-1].contiguous(), win[:, 1:].contiguous()


def held_out(job, root=None):
    """(x, y): the evaluation set of the job as the server's runner builds it,
    with data paths relative to root (the server's --files-root; None: the
    working directory). Npy: every held-out row of the seeded split. Tokens:
    the fixed windows of seq_len + 1 tokens at lo, lo + seq_len, lo +
    2 seq_len, ... that fit before the end, lo the first held-out token (the
    last floor(held_out * count) tokens of data.tokens) or, with
    data.val_tokens, the start of that file."""
    spec = job_dict(job)
    fmt = _name(spec["data"].get("format", 0), _FORMATS, "data.format")
    if fmt == "Npy":
        x, y = _npy(spec, root)
        _, held = _split(spec, x.shape[0])
        return x[held], y[held]
    T = int(spec["data"]["seq_len"])
    _, _, ev, lo = _tokens(spec, root)
    n = (len(ev) - lo - 1) // T if len(ev) - lo >= T + 1 else 0
    idx = lo + torch.arange(n, dtype=torch.int64)[:, None] * T + torch.arange(T + 1)
    win = torch.from_numpy(ev.astype("int64"))[idx]
    return win[:, :-1].contiguous(), win[:, 1:].contiguous()


def batch(job, step, root=None):
    """(x, y): the training batch of 1-based step `step` as the server draws
    it (a pure function of seed and step)."""
    spec = job_dict(job)
    fmt = _name(spec["data"].get("format", 0), _FORMATS, "data.format")
    k, bs = step - 1, int(spec["batch_size"])
    if fmt != "Npy":
        tokens, end, _, _ = _tokens(spec, root)
        return _windows(tokens, end, int(spec["data"]["seq_len"]), _seed(spec), k, bs)
    x, y = _npy(spec, root)
    train, _ = _split(spec, x.shape[0])
    per_epoch = len(train) // bs
    epoch, pos = k // per_epoch, (k % per_epoch) * bs
    order = _shuffle(len(train), _seed(spec), epoch) if spec["data"].get("shuffle", True) \
        else list(range(len(train)))
    rows = [train[i] for i in order[pos:pos + bs]]
    return x[rows], y[rows]


def loss_fn(job):
    """The job's loss of (pred, target) for one microbatch: CrossEntropy
    (mean over targets != ignore_index; 0 when none counts) or MSE (mean over
    elements)."""
    spec = job_dict(job)
    kind = _name(spec.get("loss", 0), _LOSSES, "loss")
    ignore = int(spec.get("ignore_index", -1))

    def xent(pred, target):
        pred = pred.reshape(-1, pred.shape[-1])
        target = target.reshape(-1)
        if not bool((target != ignore).any()):
            return pred.new_zeros(())
        return F.cross_entropy(pred, target, ignore_index=ignore)

    def mse(pred, target):
        return F.mse_loss(pred, target.to(pred.dtype))

    return xent if kind == "CrossEntropy" else mse


@torch.no_grad()
def evaluate(model, job, x, y, dtype=torch.float64):
    """(loss, accuracy) of model on (x, y) as the server evaluates: the mean
    loss over every counted target of the set (CrossEntropy: targets !=
    ignore_index; MSE: elements), the set run in microbatches of batch_size /
    microbatches rows (the last may be short); accuracy (CrossEntropy only,
    else None) the fraction of rows (tokens: positions) whose first largest
    logit is the target, over every row. On a training batch of equal
    microbatches this is the step's loss. Computed in dtype (float64 by
    default, so the server's float32 rounding is what remains)."""
    spec = job_dict(job)
    B = _micro(spec)
    xent = _name(spec.get("loss", 0), _LOSSES, "loss") == "CrossEntropy"
    ignore = int(spec.get("ignore_index", -1))
    m = copy.deepcopy(model).to(dtype).eval()
    total, counted, correct, rows = 0.0, 0, 0, 0
    for i in range(0, x.shape[0], B):
        xb, yb = x[i:i + B], y[i:i + B]
        if xb.is_floating_point():
            xb = xb.to(dtype)
        pred = m(xb)
        if xent:
            p = pred.reshape(-1, pred.shape[-1])
            t = yb.reshape(-1)
            total += float(F.cross_entropy(p, t, ignore_index=ignore, reduction="sum"))
            counted += int((t != ignore).sum())
            correct += int((p.argmax(dim=-1) == t).sum())
            rows += p.shape[0]
        else:
            total += float(F.mse_loss(pred, yb.to(pred.dtype), reduction="sum"))
            counted += pred.numel()
    loss = total / counted if counted else 0.0
    return loss, (correct / rows if rows else 0.0) if xent else None
