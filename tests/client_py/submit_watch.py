#!/usr/bin/python3
"""submit_watch.py - a pipetrain client in Python, with no C involved.

Builds Request messages with code that `flatc --python --gen-object-api`
generated from schema/api.fbs and Debian's python3-flatbuffers, sends each
through `nngcat --req` (package nng-utils) and reads the Response: it submits
the job in a JSON file (the JSON text of a JobSpec), follows its metrics with
WatchMetrics long polls until the job ends, asks GetJob for the final state,
and prints one JSON line per metric point and a summary line:

    {"type": "metric", "step": 3, "loss": 2.1}
    {"type": "summary", "job": 7, "state": "Succeeded", "points": 40, ...}

usage: submit_watch.py --gen DIR --server URL [--token T] JOB.json

DIR holds the generated `pipetrain` package (the caller runs flatc). Exit
status: 0 when the job succeeded, 1 on any error, 2 on usage, 3 when the job
ended in another state.
"""
import argparse
import json
import math
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--gen", required=True, help="directory with flatc's generated pipetrain/")
ap.add_argument("--server", required=True)
ap.add_argument("--token", default=None)
ap.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
ap.add_argument("job")
args = ap.parse_args()

sys.path.insert(0, args.gen)
import flatbuffers  # noqa: E402  (Debian's python3-flatbuffers)
from pipetrain import (  # noqa: E402
    CheckpointPolicy, Code, Data, DataFormat, GetJob, GetJobReply, JobSpec, JobState,
    Layer, LayerKind, LossKind, Mode, Optimizer, OptimizerKind, Placement, Request,
    RequestBody, Response, ScheduleKind, SubmitJob, SubmitJobReply,
    WatchMetrics, WatchMetricsReply)


def link_generated_modules():
    """flatc 2.0.8's Python accessors of nested tables (WatchMetricsReply.Points,
    GetJobReply.Job, ...) name classes their module never imports; give every
    generated module every generated class."""
    import importlib
    import pkgutil
    import pipetrain
    mods = [importlib.import_module("pipetrain." + m.name)
            for m in pkgutil.iter_modules(pipetrain.__path__)]
    classes = {k: v for m in mods for k, v in vars(m).items() if isinstance(v, type)
               and v.__module__ == m.__name__}
    for m in mods:
        for k, v in classes.items():
            if not hasattr(m, k):
                setattr(m, k, v)


link_generated_modules()


def enum_names(cls):
    return {k: v for k, v in vars(cls).items() if not k.startswith("_")}


def name_of(cls, value):
    for k, v in enum_names(cls).items():
        if v == value:
            return k
    return str(value)


def camel(name):
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


# Per table: the generated object class, enum fields, nested tables.
TABLES = {
    "JobSpec": (JobSpec.JobSpecT, {"loss": LossKind.LossKind, "mode": Mode.Mode},
                {"model": ("Layer", True), "data": ("Data", False),
                 "optimizer": ("Optimizer", False), "placement": ("Placement", False),
                 "checkpoint": ("CheckpointPolicy", False)}),
    "Layer": (Layer.LayerT, {"kind": LayerKind.LayerKind}, {}),
    "Data": (Data.DataT, {"format": DataFormat.DataFormat}, {}),
    "Optimizer": (Optimizer.OptimizerT,
                  {"kind": OptimizerKind.OptimizerKind, "schedule": ScheduleKind.ScheduleKind},
                  {}),
    "Placement": (Placement.PlacementT, {}, {}),
    "CheckpointPolicy": (CheckpointPolicy.CheckpointPolicyT, {}, {}),
}


def to_object(table, d):
    """A JSON object in flatc's JSON form -> the generated object-API instance."""
    cls, enums, nested = TABLES[table]
    obj = cls()
    for key, value in d.items():
        attr = camel(key)
        if not hasattr(obj, attr):
            raise SystemExit(f"submit_watch: {table} has no field {key}")
        if key in enums:
            names = enum_names(enums[key])
            value = names[value] if isinstance(value, str) else int(value)
        elif key in nested:
            sub, is_vector = nested[key]
            value = [to_object(sub, v) for v in value] if is_vector else to_object(sub, value)
        setattr(obj, attr, value)
    return obj


class Client:
    def __init__(self, url, token, timeout):
        self.url, self.token, self.timeout = url, token, timeout
        self.next_id = 1000

    def call(self, body_type, body):
        """One Request/Response exchange through nngcat; returns the Response."""
        self.next_id += 1
        req = Request.RequestT()
        req.id = self.next_id
        req.authToken = self.token
        req.bodyType = body_type
        req.body = body
        b = flatbuffers.Builder(1024)
        b.Finish(req.Pack(b))
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            f.write(b.Output())
            f.flush()
            run = subprocess.run(
                ["nngcat", "--req", "--dial", self.url, "--raw", "--file", f.name,
                 "--recv-timeout", str(max(1, math.ceil(self.timeout))),
                 "--recv-maxsz", str(128 << 20)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=self.timeout + 10)
        if run.returncode != 0 or not run.stdout:
            raise SystemExit(f"submit_watch: nngcat failed ({run.returncode}): "
                             f"{run.stderr.decode(errors='replace').strip()}")
        resp = Response.Response.GetRootAs(bytearray(run.stdout), 0)
        if resp.Id() != req.id:
            raise SystemExit(f"submit_watch: reply id {resp.Id()} for request {req.id}")
        if resp.Code() != Code.Code.OK:
            msg = (resp.Message() or b"").decode()
            raise SystemExit(f"submit_watch: {name_of(Code.Code, resp.Code())}: {msg}")
        if resp.BodyType() != body_type:
            raise SystemExit(f"submit_watch: reply body type {resp.BodyType()}")
        return resp


def body_as(resp, cls):
    t = resp.Body()
    out = cls()
    out.Init(t.Bytes, t.Pos)
    return out


def main():
    with open(args.job) as f:
        spec = to_object("JobSpec", json.load(f))
    c = Client(args.server, args.token, args.timeout)

    sub = SubmitJob.SubmitJobT()
    sub.spec = spec
    r = body_as(c.call(RequestBody.RequestBody.SubmitJob, sub), SubmitJobReply.SubmitJobReply)
    job = r.Job()

    cursor, points, first_loss, last_loss = -1, 0, None, None
    while True:
        w = WatchMetrics.WatchMetricsT()
        w.job, w.cursor, w.waitMs = job, cursor, 1000
        r = body_as(c.call(RequestBody.RequestBody.WatchMetrics, w),
                    WatchMetricsReply.WatchMetricsReply)
        for i in range(r.PointsLength()):
            p = r.Points(i)
            if p.Step() <= cursor:
                continue
            points += 1
            first_loss = p.Loss() if first_loss is None else first_loss
            last_loss = p.Loss()
            cursor = p.Step()
            print(json.dumps({"type": "metric", "step": p.Step(), "loss": p.Loss()}),
                  flush=True)
        cursor = max(cursor, r.Cursor())
        if r.Ended():
            break

    g = GetJob.GetJobT()
    g.job = job
    info = body_as(c.call(RequestBody.RequestBody.GetJob, g), GetJobReply.GetJobReply).Job()
    state = name_of(JobState.JobState, info.State())
    acc = info.Last().EvalAccuracy() if info.Last() is not None else float("nan")
    print(json.dumps({"type": "summary", "job": job, "state": state, "points": points,
                      "steps": info.Steps(), "first_loss": first_loss,
                      "last_loss": last_loss,
                      "eval_accuracy": acc if math.isfinite(acc) else None}), flush=True)
    return 0 if state == "Succeeded" else 3


if __name__ == "__main__":
    sys.exit(main())
