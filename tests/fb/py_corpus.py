#!/usr/bin/env python3
"""py_corpus.py OUT - write FlatBuffers built by this Python's flatbuffers
package (Debian's python3-flatbuffers 2.0.8, or PyPI's) with the generated
code in client/python/pipetrain, for tests/fb/verify_diff.

OUT gets frames: a root tag byte (Q Request, R Response, J JobSpec), a u32
little-endian length, the buffer. Every request kind, replies with nested
tables, vectors and strings, and JobSpec roots of examples/*.json.
"""
import glob
import json
import math
import os
import struct
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import flatbuffers  # noqa: E402
import pipetrain  # noqa: E402  (links the generated modules)
from pipetrain import _convert  # noqa: E402


def mod(name):
    return _convert.module(name)


def finish(obj):
    b = flatbuffers.Builder(1024)
    b.Finish(obj.Pack(b))
    return bytes(b.Output())


def request(body_name, body, rid=1, token="t0ken"):
    q = mod("Request").RequestT()
    q.id, q.authToken = rid, token
    q.bodyType = _convert.enum_value("RequestBody", body_name, "body")
    q.body = body
    return finish(q)


def response(body_name, body, code=0, message=None, rid=7):
    r = mod("Response").ResponseT()
    r.id, r.code, r.message = rid, code, message
    if body_name is not None:
        r.bodyType = _convert.enum_value("ResponseBody", body_name, "body")
        r.body = body
    return finish(r)


def obj(table, d):
    return _convert.to_object(table, d, table)


def main(out):
    frames = []
    specs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.json"))):
        with open(path) as f:
            specs.append(json.load(f))
    for s in specs:
        frames.append((b"J", finish(obj("JobSpec", s))))
        frames.append((b"Q", request("SubmitJob", obj("SubmitJob", {"spec": s}))))
    for kind, d in [("GetJob", {"job": 3}), ("ListJobs", {}), ("CancelJob", {"job": 9}),
                    ("WatchMetrics", {"job": 2, "cursor": 40, "wait_ms": 500,
                                      "max_points": 100}),
                    ("FetchCheckpoint", {"job": 2, "step": 100, "offset": 1 << 20,
                                         "length": 65536}),
                    ("ListCheckpoints", {"job": 2}), ("ServerInfo", {})]:
        frames.append((b"Q", request(kind, obj(kind, d))))
        frames.append((b"Q", request(kind, obj(kind, d), token=None)))
    point = {"step": 5, "loss": 2.5, "learning_rate": 0.001, "grad_norm": 1.25,
             "samples_per_second": 1000.0, "bubble": 0.25,
             "stage_busy": [0.5, 0.25, 0.125], "eval_loss": math.nan,
             "eval_accuracy": 0.75, "time_unix": 1.7e9}
    stage = {"stage": 0, "busy_seconds": 1.5, "has_comm": True, "messages_sent": 10,
             "bytes_sent": 4096}
    info = {"id": 3, "name": "digits", "state": "Running", "step": 5, "steps": 400,
            "submitted_unix": 1.7e9, "last": point, "spec": specs[0],
            "stages": [dict(stage, stage=-1), stage, dict(stage, stage=1)]}
    frames.append((b"R", response("SubmitJobReply", obj("SubmitJobReply", {"job": 4}))))
    frames.append((b"R", response("GetJobReply", obj("GetJobReply", {"job": info}))))
    frames.append((b"R", response("ListJobsReply", obj("ListJobsReply", {
        "jobs": [dict(info, spec=None), dict(info, id=4, name="b", last=None)]}))))
    frames.append((b"R", response("CancelJobReply", obj("CancelJobReply",
                                                        {"state": "Cancelled"}))))
    frames.append((b"R", response("WatchMetricsReply", obj("WatchMetricsReply", {
        "points": [point, dict(point, step=6, stage_busy=[])], "cursor": 6,
        "state": "Running", "ended": False}))))
    frames.append((b"R", response("FetchCheckpointReply", obj("FetchCheckpointReply", {
        "step": 100, "total_size": 300, "offset": 0, "data": list(range(256)) + [1] * 44,
        "sha256": "ab" * 32}))))
    frames.append((b"R", response("ListCheckpointsReply", obj("ListCheckpointsReply", {
        "checkpoints": [{"step": 100, "size": 300, "sha256": "cd" * 32},
                        {"step": 200, "size": 300, "sha256": "ef" * 32}]}))))
    frames.append((b"R", response("ServerInfoReply", obj("ServerInfoReply", {
        "version": "0.1.0", "protocol": 1, "device": "cpu", "jobs_queued": 1,
        "uptime_seconds": 12.5}))))
    frames.append((b"R", response(None, None, code=3, message="model[3]: bad")))
    with open(out, "wb") as f:
        for tag, buf in frames:
            f.write(tag + struct.pack("<I", len(buf)) + buf)
    print(f"py_corpus: {len(frames)} frames with flatbuffers from "
          f"{os.path.dirname(flatbuffers.__file__)}")


if __name__ == "__main__":
    main(sys.argv[1])
