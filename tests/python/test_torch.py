"""pipetrain.torch against a real pipeserver: checkpoints load into the
module build_model makes, PyTorch's loss on the server's evaluation set is
the server's eval loss, and init_from starts a job from a PyTorch-written
file. Needs PyTorch (Debian: python3-torch); run.sh runs this file with
/usr/bin/python3."""
import json
import os
import shutil

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed for this Python (Debian: apt install "
    "python3-torch; deploy/install-deps.sh does on Debian)")

import pipetrain  # noqa: E402
import pipetrain.torch as ptt  # noqa: E402
from conftest import ROOT, Server  # noqa: E402

REL = 1e-5


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A files root holding a copy of examples/ (init_from files go next to it)."""
    d = tmp_path_factory.mktemp("root")
    shutil.copytree(os.path.join(ROOT, "examples"), d / "examples")
    return str(d)


@pytest.fixture(scope="module")
def srv(root):
    s = Server(root=root)
    yield s
    s.stop()


def example(name, **over):
    with open(os.path.join(ROOT, "examples", name)) as f:
        job = json.load(f)
    job.update(over)
    return job


def gpt(**over):
    return example("gpt.json", **dict(dict(steps=24, eval_every=24,
                                           checkpoint={"every_steps": 24}), **over))


def run(c, job):
    """Submits job, waits for the end; returns its metric points."""
    jid = c.submit(job)
    points = list(c.watch(jid))
    g = c.get(jid)
    assert g["state"] == "Succeeded", g
    return jid, points


def close(a, b):
    return abs(a - b) <= REL * abs(b)


@pytest.fixture(scope="module")
def gpt_ckpt(srv, root, tmp_path_factory):
    """(job, last metric point, checkpoint path) of a short examples/gpt.json run."""
    job = gpt()
    with pipetrain.Client(srv.url, timeout=60) as c:
        jid, points = run(c, job)
        path = str(tmp_path_factory.mktemp("ck") / "gpt.safetensors")
        info = c.fetch_checkpoint(jid, path)
    assert info["step"] == 24 and points[-1]["step"] == 24
    return job, points[-1], path


def test_state_dict_is_the_checkpoint(gpt_ckpt):
    job, _, path = gpt_ckpt
    sd = ptt.load_safetensors(path)
    model = ptt.build_model(job)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in sd.items()}
    assert list(model.state_dict())[:4] == ["0.wte.weight", "0.wpe.weight",
                                            "1.ln_1.weight", "1.ln_1.bias"]
    model.load_state_dict(sd, strict=True)
    # The job file's path gives the same module.
    by_path = ptt.build_model(os.path.join(ROOT, "examples", "gpt.json"))
    by_path.load_state_dict(sd, strict=True)


def test_gpt_eval_loss_equals_pytorch(gpt_ckpt, root):
    job, last, path = gpt_ckpt
    model = ptt.build_model(job)
    model.load_state_dict(ptt.load_safetensors(path), strict=True)
    x, y = ptt.held_out(job, root)
    # The last floor(0.2 * 168823) = 33764 tokens hold (33764 - 1) // 64 windows.
    assert tuple(x.shape) == (527, 64)
    loss, acc = ptt.evaluate(model, job, x, y)
    print("gpt eval: server", last["eval_loss"], last["eval_accuracy"], "pytorch", loss, acc)
    assert close(loss, last["eval_loss"])
    assert abs(acc - last["eval_accuracy"]) <= 1 / (527 * 64)
    # float32 PyTorch agrees too, just less tightly.
    loss32, _ = ptt.evaluate(model, job, x, y, dtype=torch.float32)
    assert abs(loss32 - last["eval_loss"]) <= 1e-4 * last["eval_loss"]


def test_digits_eval_loss_and_accuracy_equal_pytorch(srv, root, tmp_path):
    job = example("digits.json", steps=100, eval_every=100)
    with pipetrain.Client(srv.url, timeout=60) as c:
        jid, points = run(c, job)
        c.fetch_checkpoint(jid, tmp_path / "d.safetensors")
    last = points[-1]
    model = ptt.build_model(job)
    model.load_state_dict(ptt.load_safetensors(tmp_path / "d.safetensors"), strict=True)
    x, y = ptt.held_out(job, root)
    assert tuple(x.shape) == (359, 64)  # every held-out row (the last microbatch: 7)
    loss, acc = ptt.evaluate(model, job, x, y)
    print("digits eval: server", last["eval_loss"], last["eval_accuracy"], "pytorch", loss,
          acc)
    assert close(loss, last["eval_loss"])
    assert acc == last["eval_accuracy"] and acc > 0.8
    # The same weights through init_from, on 4 stages: step 1's loss is
    # PyTorch's on the step-1 batch (the seeded shuffle of the training rows).
    shutil.copy(tmp_path / "d.safetensors", os.path.join(root, "digits.safetensors"))
    spec = dict(job, init_from="digits.safetensors", steps=1, eval_every=0, seed=5)
    with pipetrain.Client(srv.url, timeout=60) as c:
        _, points = run(c, spec)
    x, y = ptt.batch(spec, 1, root)
    assert tuple(x.shape) == (64, 64)
    want, _ = ptt.evaluate(model, spec, x, y)
    print("digits step-1 loss: server", points[0]["loss"], "pytorch", want)
    assert close(points[0]["loss"], want)


def test_token_eval_windows_are_never_trained_on(gpt_ckpt, root, srv):
    """Every training window of every step of the job ends before the first
    evaluation window begins (both as the server draws them: the eval and
    step-1 losses above equal PyTorch's on exactly these windows), and the
    job's status states the evaluation set."""
    job, _, _ = gpt_ckpt
    tokens, split, _, lo = ptt._tokens(job, root)
    T, B = job["data"]["seq_len"], job["batch_size"]
    assert split == lo == 168823 - 33764
    x, _ = ptt.held_out(job, root)
    assert int(x[0, 0]) == int(tokens[lo]) and x.shape[0] * T + 1 <= len(tokens) - lo
    for step in range(job["steps"]):
        for b in range(B):
            w = ptt.philox(job["seed"], step, b)
            off = ((w[1] << 32) | w[0]) % (split - T)
            assert off + T < lo  # its last target is token off + T
    with pipetrain.Client(srv.url, timeout=60) as c:
        jid, _ = run(c, gpt(steps=1, checkpoint={"every_steps": 0}))
        assert c.get(jid)["message"] == (
            "data.tokens: 168823 u16 tokens (raw, no header); eval: 527 windows of 64 "
            "tokens from the held-out end of data.tokens")


def test_llmc_token_files(srv, root, tmp_path):
    """An llm.c .bin trains as the tokens after its header: Auto and Tokens16
    read it alike (same losses as the raw file of the same tokens), and a
    Tokens16 job on a version-2 (uint32) file is refused naming data.format."""
    import numpy as np
    text = np.fromfile(os.path.join(root, "examples/data/text.u16"), dtype="<u2")[:20000]
    head = np.zeros(256, dtype="<i4")
    head[:3] = [20240520, 1, len(text)]
    with open(os.path.join(root, "text.bin"), "wb") as f:
        f.write(head.tobytes() + text.tobytes())
    text.tofile(os.path.join(root, "raw.u16"))
    head[1] = 2
    with open(os.path.join(root, "text32.bin"), "wb") as f:
        f.write(head.tobytes() + text.astype("<u4").tobytes())
    losses = {}
    with pipetrain.Client(srv.url, timeout=60) as c:
        for name, fmt in (("raw.u16", "Tokens16"), ("text.bin", "Tokens16"),
                          ("text.bin", "Auto"), ("text32.bin", "Auto")):
            spec = gpt(steps=2, eval_every=2, checkpoint={"every_steps": 0})
            spec["data"] = dict(spec["data"], format=fmt, tokens=name)
            jid, points = run(c, spec)
            losses[name, fmt] = [(p["loss"], p["eval_loss"]) for p in points]
            msg = c.get(jid)["message"]
            print(name, fmt, msg)
            if fmt == "Auto":
                assert "picked by Auto" in msg and "llm.c header v" in msg, msg
        spec = gpt(steps=2)
        spec["data"] = dict(spec["data"], tokens="text32.bin")
        assert submit_error(c, spec) == (
            "data.format: Tokens16, but data.tokens 'text32.bin' has an llm.c header of "
            "version 2 (u32 tokens): use Tokens32 or Auto")
    assert len(set(map(tuple, losses.values()))) == 1, losses
    spec["data"]["format"] = "Auto"
    x, _ = ptt.held_out(spec, root)
    assert x.shape[0] == (4000 - 1) // 64  # the last floor(0.2 * 20000) tokens


def submit_error(c, job):
    with pytest.raises(pipetrain.InvalidJob) as e:
        c.submit(job)
    return e.value.message


def test_init_from_mismatch_refused_at_submit(srv, root, gpt_ckpt):
    job, _, path = gpt_ckpt
    sd = ptt.load_safetensors(path)
    cases = []
    bad = dict(sd)
    bad["1.attn.c_attn.weight"] = sd["1.attn.c_attn.weight"].t()
    cases.append((bad, "init_from: tensor '1.attn.c_attn.weight': shape [64, 192], "
                       "expected [192, 64]"))
    bad = dict(sd)
    del bad["2.mlp.c_fc.bias"]
    cases.append((bad, "init_from: tensor '2.mlp.c_fc.bias' (model[2]) is missing"))
    bad = dict(sd)
    bad["0.wpe.weight"] = sd["0.wpe.weight"].double()
    cases.append((bad, "init_from: tensor '0.wpe.weight': dtype F64, expected F32"))
    bad = dict(sd)
    bad["5.weight"] = torch.zeros(2)
    cases.append((bad, "init_from: tensor '5.weight' is not a parameter of this model"))
    with pipetrain.Client(srv.url, timeout=60) as c:
        for i, (tensors, want) in enumerate(cases):
            name = f"bad{i}.safetensors"
            ptt.save_safetensors(tensors, os.path.join(root, name))
            assert submit_error(c, gpt(init_from=name)) == want
        assert submit_error(c, gpt(init_from="none.safetensors")).startswith(
            "init_from: ")
        assert submit_error(c, gpt(init_from="../x.safetensors")) == \
            "init_from: outside the files root (absolute paths and '..' are refused)"
        with open(os.path.join(root, "junk.safetensors"), "wb") as f:
            f.write(b"\x04\x00\x00\x00\x00\x00\x00\x00{}")
        msg = submit_error(c, gpt(init_from="junk.safetensors"))
        assert msg.startswith("init_from: junk.safetensors: "), msg


def test_init_from_starts_from_those_weights(srv, root, gpt_ckpt):
    """A job initialised from a file - PyTorch-written, and our own
    checkpoint - has as step-1 loss PyTorch's loss of the file's weights on
    the step-1 batch."""
    job, _, path = gpt_ckpt
    model = ptt.build_model(job)
    model.load_state_dict(ptt.load_safetensors(path), strict=True)
    with torch.no_grad():  # weights the server never had
        for p in model.parameters():
            p.mul_(0.9)
    ptt.save_safetensors(model.state_dict(), os.path.join(root, "torch.safetensors"))
    shutil.copy(path, os.path.join(root, "ours.safetensors"))
    with pipetrain.Client(srv.url, timeout=60) as c:
        for name in ("torch.safetensors", "ours.safetensors"):
            spec = gpt(init_from=name, steps=2, eval_every=0, seed=7,
                       checkpoint={"every_steps": 0})
            _, points = run(c, spec)
            m = ptt.build_model(spec)
            m.load_state_dict(ptt.load_safetensors(os.path.join(root, name)), strict=True)
            x, y = ptt.batch(spec, 1, root)
            want, _ = ptt.evaluate(m, spec, x, y)
            print(name, "step-1 loss: server", points[0]["loss"], "pytorch", want)
            assert close(points[0]["loss"], want)
            # Without init_from the same job starts elsewhere.
            if name == "ours.safetensors":
                spec.pop("init_from")
                _, fresh = run(c, spec)
                assert not close(fresh[0]["loss"], want)
