"""The pipetrain Python package against a real pipeserver."""
import hashlib
import json
import os
import socket
import subprocess
import sys

import flatbuffers
import pytest

import pipetrain
from conftest import ROOT, Server, Worker, wait_for

DIGITS = os.path.join(ROOT, "examples", "digits.json")


def digits(steps=60, every=20, **over):
    with open(DIGITS) as f:
        job = json.load(f)
    job.update(steps=steps, eval_every=every, checkpoint={"every_steps": every, "keep": 3})
    job.update(over)
    return job


def test_flatbuffers_under_test():
    """Says which flatbuffers runs the suite (run.sh runs it with each)."""
    want = os.environ.get("PT_EXPECT_FLATBUFFERS")
    print("flatbuffers from", flatbuffers.__file__)
    if want:
        assert os.path.realpath(flatbuffers.__file__).startswith(os.path.realpath(want))


def test_full_digits_flow(server, tmp_path):
    with pipetrain.Client(server.url, timeout=20) as c:
        info = c.info()
        assert info["device"] == "cpu" and info["protocol"] >= 1
        assert info["kernels"].startswith("cpu: ") and "; matmul: oneDNN " in info["kernels"]
        job = c.submit(digits())
        assert isinstance(job, int) and job >= 1
        points = list(c.watch(job))
        assert [p["step"] for p in points] == list(range(1, 61))
        assert all(p["loss"] > 0 for p in points)
        assert points[-1]["loss"] < points[0]["loss"]
        assert points[0]["eval_loss"] is None and points[19]["eval_loss"] is not None
        plans = c.plan(digits(), stages=[1, 2], microbatches=[4])
        # Interleaved (2 chunks a stage) fits the 5 layers at 1 and 2 stages.
        assert len(plans) == 8 and {p["schedule"] for p in plans} == {
            "gpipe", "1f1b", "zb-h1", "interleaved"}
        assert all(p["step_seconds"] > 0 for p in plans)
        assert [p["step_seconds"] for p in plans] == sorted(p["step_seconds"] for p in plans)
        for p in plans:
            v = 2 if p["schedule"] == "interleaved" else 1
            assert (p["virtual_stages"] or 1) == v
            assert len(p["boundaries"]) == p["stages"] * v + 1
        g = c.get(job)
        assert g["id"] == job and g["state"] == "Succeeded" and g["step"] == 60
        assert g["name"] == "digits-mlp"
        assert g["spec"]["model"][0]["kind"] == "Linear"
        assert g["spec"]["data"]["format"] == "Npy"
        assert g["last"]["step"] == 60 and 0.5 < g["last"]["eval_accuracy"] <= 1.0
        assert [s["stage"] for s in g["stages"]] == [-1, 0, 1, 2, 3]
        # The last step's timeline: an F and a B of each of 4 microbatches per stage.
        tl = g["timeline"]
        assert len(tl) == 32 and sorted({t["stage"] for t in tl}) == [0, 1, 2, 3]
        assert sorted(t["kind"] for t in tl) == [0] * 16 + [1] * 16
        assert all(0 <= t["start"] <= t["end"] for t in tl)
        assert job in [j["id"] for j in c.list()]
        cks = c.checkpoints(job)
        assert [k["step"] for k in cks] == [20, 40, 60]
        out = tmp_path / "last.safetensors"
        got = c.fetch_checkpoint(job, out)
        assert got == cks[-1]
        data = out.read_bytes()
        assert len(data) == cks[-1]["size"]
        assert hashlib.sha256(data).hexdigest() == cks[-1]["sha256"]
        assert not os.path.exists(str(out) + ".part")
        got = c.fetch_checkpoint(job, tmp_path / "first.safetensors", step=20)
        assert got == cks[0]
        with pytest.raises(pipetrain.Conflict) as e:
            c.cancel(job)
        assert e.value.code == 5 and "Succeeded" in e.value.message
        with pytest.raises(pipetrain.NotFound) as e:
            c.get(job + 1000)
        assert e.value.code == 4


def test_same_losses_as_pipeclient(server, tmp_path):
    """The same job file through the Python client and through pipeclient
    (the C library) trains to the same losses, bitwise."""
    pc = os.environ.get("PIPECLIENT")
    if not pc:
        pytest.skip("PIPECLIENT not set")
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(digits(steps=12, every=6)))
    with pipetrain.Client(server.url) as c:
        a = c.submit(str(job_file))
        la = [p["loss"] for p in c.watch(a)]
    r = subprocess.run([pc, "--server", server.url, "submit", str(job_file), "--follow"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with pipetrain.Client(server.url) as c:
        b = max(j["id"] for j in c.list())
        lb = [p["loss"] for p in c.watch(b)]
    assert b != a and la == lb and len(la) == 12


def test_cancel_running(server):
    with pipetrain.Client(server.url) as c:
        job = c.submit(digits(steps=100000, every=0))
        assert pipetrain_wait(lambda: c.get(job)["state"] == "Running")
        assert c.info()["devices_in_use"] == 1  # its stages run on the server's cpu
        assert c.cancel(job) == "Cancelled"
        for _ in c.watch(job):
            pass
        assert c.get(job)["state"] == "Cancelled"
        assert c.info()["devices_in_use"] == 0


def pipetrain_wait(pred):
    from conftest import wait_for
    return wait_for(pred)


def test_invalid_job_names_field(server):
    with pipetrain.Client(server.url) as c:
        with pytest.raises(pipetrain.InvalidJob) as e:
            c.submit(digits(batch_size=63))
        assert e.value.code == 3 and "batch_size" in e.value.message
        with pytest.raises(ValueError, match=r"job\.model\[1\]\.kind: unknown LayerKind"):
            bad = digits()
            bad["model"][1]["kind"] = "Relu"
            c.submit(bad)
        with pytest.raises(ValueError, match=r"job\.data\.feature: Data has no field 'feature'"):
            c.submit(digits(data={"feature": "x.npy"}))


def test_job_file_as_flatc_reads_it(server, tmp_path):
    """Comments, trailing commas and bare names, as flatc's JSON parser takes
    them; and the FlatBuffers binary of the same file (flatc -b)."""
    text = open(DIGITS).read()
    text = text.replace('"name": "digits-mlp",', '// a comment\n  name: "digits-mlp",')
    text = text.replace('"eval_every": 100\n', '"eval_every": 100, /* trailing */\n')
    p = tmp_path / "loose.json"
    p.write_text(text)
    spec = pipetrain.load_job(str(p))
    assert spec.name == "digits-mlp" and spec.evalEvery == 100 and len(spec.model) == 5
    subprocess.run(["flatc", "-b", "-o", str(tmp_path), os.path.join(ROOT, "schema", "job.fbs"),
                    DIGITS], check=True)
    binspec = pipetrain.load_job(str(tmp_path / "digits.job"))
    assert binspec.name == spec.name and binspec.steps == spec.steps
    assert [m.outFeatures for m in binspec.model] == [m.outFeatures for m in spec.model]


def _fields(obj, pre=""):
    """Every scalar of a generated object-API instance, by dotted path."""
    out = {}
    for k, v in vars(obj).items():
        if v is None or v == []:
            continue  # absent: flatc's null and [] read back as absent
        items = enumerate(v) if isinstance(v, list) else [(None, v)]
        for i, x in items:
            at = pre + k + ("" if i is None else f"[{i}]")
            if hasattr(x, "__dict__"):
                out.update(_fields(x, at + "."))
            else:
                out[at] = x
    return out


@pytest.mark.parametrize("name", ["dialect-digits.json", "dialect-gpt.json"])
def test_job_file_dialect_equals_flatc(name, tmp_path):
    """The whole flatc dialect (single quotes, hex and hex floats, numbers and
    booleans in quotes, inf/nan, enums by number, null, ///): load_job of
    the JSON equals load_job of flatc -b's binary of the same file, field by
    field (NaN compared as NaN)."""
    src = os.path.join(ROOT, "tests", "fuzz", "corpus", "jobjson", name)
    subprocess.run(["flatc", "-b", "-o", str(tmp_path), os.path.join(ROOT, "schema", "job.fbs"),
                    src], check=True)
    ours = _fields(pipetrain.load_job(src))
    ref = _fields(pipetrain.load_job(str(tmp_path / name.replace(".json", ".job"))))
    assert ours.keys() == ref.keys()
    for k in ref:
        a, b = ours[k], ref[k]
        if isinstance(b, float) and b != b:
            assert a != a, k
        elif isinstance(b, float):
            assert a == pytest.approx(b, rel=1e-7), k  # flatc stores float32
        else:
            assert a == b, k


@pytest.mark.parametrize("text,words", [
    ("{a: 1, a: 2}", "line 1, column 8: field 'a' given twice"),
    ("{\n  # a comment\n}", "line 2, column 3: a field name expected"),
    ('{"steps": 5.0}', "job.steps: integer expected"),
    ('{"model": [,]}', "line 1, column 12: unexpected character ','"),
    ("{name: 'a\\q'}", "unknown escape"),
    ("{name: digits}", "job.name: string expected"),
    ('{"steps": 1} x', "text after the job object"),
])
def test_job_file_dialect_refusals(text, words, tmp_path):
    """What flatc refuses, load_job refuses with the line and column."""
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(ValueError) as e:
        pipetrain.load_job(str(p))
    assert str(e.value).startswith(str(p) + ": ") and words in str(e.value)


def test_object_api_unpacks_a_reply():
    """ResponseT.InitFromObj (the object API) reads a reply with a union body:
    flatc 2.0.8's Response.py calls ResponseBodyCreator without importing
    it, which pipetrain links in."""
    from pipetrain import Response, ResponseBody, ServerInfoReply
    info = ServerInfoReply.ServerInfoReplyT()
    info.version, info.protocol = "9.9.9", 7
    r = Response.ResponseT()
    r.id, r.bodyType, r.body = 5, ResponseBody.ResponseBody.ServerInfoReply, info
    b = flatbuffers.Builder(0)
    b.Finish(r.Pack(b))
    got = Response.ResponseT.InitFromObj(Response.Response.GetRootAs(b.Output(), 0))
    assert got.id == 5 and got.bodyType == ResponseBody.ResponseBody.ServerInfoReply
    assert got.body.version == b"9.9.9" or got.body.version == "9.9.9"
    assert got.body.protocol == 7


def test_pool_workers():
    """workers() lists the pool with states; a job without workers runs on
    two of them; drain_worker marks one; an unknown URL is NotFound."""
    ws = [Worker(), Worker()]
    s = Server(extra=("--pool", ",".join(w.url for w in ws), "--devices", "none"))
    try:
        with pipetrain.Client(s.url) as c:
            assert wait_for(lambda: [w["state"] for w in c.workers()] == ["Idle", "Idle"])
            assert [w["url"] for w in c.workers()] == [w.url for w in ws]
            assert all(w["devices"].startswith("cpu (") for w in c.workers())
            assert c.info()["workers"] == 2 and c.info()["workers_free"] == 2
            job = c.submit(digits(steps=20, placement={"stages": 2}))
            assert wait_for(lambda: c.get(job)["state"] == "Succeeded")
            assert c.info()["devices_in_use"] == 0
            c.drain_worker(ws[0].url)
            assert [w["draining"] for w in c.workers()] == [True, False]
            with pytest.raises(pipetrain.NotFound):
                c.drain_worker("tcp://127.0.0.1:1")
    finally:
        s.stop()
        for w in ws:
            w.stop()


def test_wrong_token():
    s = Server(token="s3cret-token")
    try:
        for token in (None, "wrong"):
            with pipetrain.Client(s.url, token=token) as c:
                with pytest.raises(pipetrain.Unauthorized) as e:
                    c.info()
                assert e.value.code == 2 and e.value.name == "Unauthorized"
                with pytest.raises(pipetrain.Unauthorized):
                    c.submit(digits())
        with pipetrain.Client(s.url, token="s3cret-token") as c:
            assert c.info()["jobs_queued"] == 0
            assert c.list() == []
    finally:
        s.stop()


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def test_server_down():
    with pytest.raises(pipetrain.ConnectError, match="127.0.0.1"):
        pipetrain.Client(f"tcp://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(ValueError, match="did you mean tcp://127.0.0.1:7600"):
        pipetrain.Client("127.0.0.1:7600")


def test_server_gone_mid_session():
    s = Server()
    c = pipetrain.Client(s.url, timeout=2)
    assert c.info()["device"] == "cpu"
    s.stop()
    with pytest.raises((pipetrain.Timeout, pipetrain.ConnectError)):
        c.info()
    c.close()


def test_interrupted_download_resumes(server, tmp_path):
    with pipetrain.Client(server.url) as c:
        job = c.submit(digits(steps=10, every=10))
        for _ in c.watch(job):
            pass
        ck = c.checkpoints(job)[-1]
        out = tmp_path / "ck.safetensors"
        part = tmp_path / "ck.safetensors.part"
        seen = []

        def stop_after_two(done, total):
            seen.append(done)
            return len(seen) < 2

        with pytest.raises(pipetrain.PipetrainError, match="kept for a resume"):
            c.fetch_checkpoint(job, out, chunk=64 << 10, progress=stop_after_two)
        assert seen == [64 << 10, 128 << 10]
        assert part.stat().st_size == 128 << 10 and not out.exists()
        seen.clear()
        got = c.fetch_checkpoint(job, out, chunk=64 << 10, progress=lambda d, t: seen.append(d))
        assert got == ck
        assert seen[0] == 192 << 10 and seen[-1] == ck["size"]  # resumed, not restarted
        assert hashlib.sha256(out.read_bytes()).hexdigest() == ck["sha256"]
        assert not part.exists()

        # A .part of another, larger file is dropped and the download restarts.
        part.write_bytes(b"\x00" * (ck["size"] + 100))
        got = c.fetch_checkpoint(job, out)
        assert hashlib.sha256(out.read_bytes()).hexdigest() == ck["sha256"]
        # A .part whose prefix differs: found by the SHA-256, restarted once.
        part.write_bytes(b"\xff" * 1000)
        got = c.fetch_checkpoint(job, out)
        assert hashlib.sha256(out.read_bytes()).hexdigest() == ck["sha256"]


def test_generated_code_is_current(tmp_path):
    """The checked-in generated modules equal what gen.py (flatc) writes now."""
    pkg = os.path.join(ROOT, "client", "python", "pipetrain")
    subprocess.run([sys.executable, os.path.join(ROOT, "client", "python", "gen.py"),
                    "--out", str(tmp_path)], check=True)
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".py"))
    assert "_schema.py" in names and "Request.py" in names
    for n in names:
        with open(os.path.join(pkg, n)) as f:
            assert f.read() == (tmp_path / n).read_text(), \
                f"client/python/pipetrain/{n} is stale: run client/python/gen.py"
    ours = {"__init__.py", "client.py", "errors.py", "_convert.py", "torch.py"}
    extra = set(n for n in os.listdir(pkg) if n.endswith(".py")) - set(names) - ours
    assert not extra, f"generated files no schema type has: {sorted(extra)}"
