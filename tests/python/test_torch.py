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
    assert tuple(x.shape) == (64, 64)  # 64 windows: whole microbatches of 4
    loss, acc = ptt.evaluate(model, job, x, y)
    print("gpt eval: server", last["eval_loss"], last["eval_accuracy"], "pytorch", loss, acc)
    assert close(loss, last["eval_loss"])
    assert acc == last["eval_accuracy"]
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
    assert tuple(x.shape) == (352, 64)  # 359 held out, whole microbatches of 16
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
