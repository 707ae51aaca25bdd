"""Client: the pipetrain API over nng REQ/REP (schema/api.fbs), as libpipeclient.

Every call is one or more Request/Response exchanges on one REQ socket; a
Client may be shared by threads (calls are serialised). Replies are plain
dicts with the schema's field names and enums by name.
"""
import hashlib
import os
import threading

import flatbuffers

try:
    import pynng
except ImportError:  # pipetrain.torch and the generated code need no transport
    pynng = None

from . import _convert, errors

DEFAULT_TIMEOUT = 30.0
RECV_MAX = 64 << 20  # FetchCheckpoint ranges are at most 4 MiB; the rest is headroom
FETCH_CHUNK = 4 << 20


class Client:
    """A connection to a pipeserver at url ("tcp://host:7600", "ipc:///path",
    "tls+tcp://..." as nng supports), with the server's --auth-token if it has
    one. timeout: seconds to wait for each reply (a WatchMetrics long poll
    waits its wait_ms more). Connects at once: a server that is not there is
    ConnectError here, not a timeout later. Use as a context manager or close()."""

    def __init__(self, url, token=None, timeout=DEFAULT_TIMEOUT):
        if "://" not in url:
            raise ValueError(f"url '{url}' has no scheme: did you mean tcp://{url}?")
        if pynng is None:
            raise ImportError("pipetrain.Client needs pynng (pip install pynng)")
        self.url = url
        self.token = token
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._next_id = 0
        self._sock = pynng.Req0(recv_max_size=RECV_MAX,
                                send_timeout=int(self.timeout * 1000),
                                resend_time=-1)
        try:
            self._sock.dial(url, block=True)
        except pynng.NNGException as e:
            self._sock.close()
            raise errors.ConnectError(f"{url}: {e}") from None

    def close(self):
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------ plumbing --

    def _call(self, body_name, fields, extra_wait=0.0):
        """Sends a Request with body body_name (a RequestBody member) built from
        fields; returns the reply body's accessor (pipetrain.<Reply>)."""
        return self._exchange(body_name, _convert.to_object(body_name, fields, body_name),
                              extra_wait)

    def _exchange(self, body_name, body, extra_wait=0.0):
        """Sends body (a generated <body_name>T) in a Request; returns the reply's
        body accessor, or raises the error the reply carries."""
        with self._lock:
            self._next_id += 1
            rid = self._next_id
            req = _convert.module("Request").RequestT()
            req.id = rid
            req.authToken = self.token
            req.bodyType = _convert.enum_value("RequestBody", body_name, "body")
            req.body = body
            b = flatbuffers.Builder(1024)
            b.Finish(req.Pack(b))
            self._sock.recv_timeout = int((self.timeout + extra_wait) * 1000)
            try:
                self._sock.send(bytes(b.Output()))
                raw = self._sock.recv()
            except pynng.Timeout:
                raise errors.Timeout(f"{self.url}: no reply to {body_name} within "
                                     f"{self.timeout + extra_wait:g} s") from None
            except pynng.NNGException as e:
                raise errors.ConnectError(f"{self.url}: {e}") from None
        return self._reply(raw, rid, body_name, body_name + "Reply")

    def _reply(self, raw, rid, body_name, reply_name):
        buf = bytearray(raw)
        try:
            resp = _convert.module("Response").Response.GetRootAs(buf, 0)
            code, rid2 = resp.Code(), resp.Id()
            message = (resp.Message() or b"").decode("utf-8", "replace")
            body_type = resp.BodyType()
        except Exception as e:  # a buffer that is no Response
            raise errors.ProtocolError(f"{body_name}: unreadable reply ({e})") from None
        if rid2 != rid:
            raise errors.ProtocolError(f"{body_name}: reply id {rid2} for request {rid}")
        if code != 0:
            raise errors.from_reply(code, _convert.enum_name("Code", code), message)
        if body_type != _convert.enum_value("ResponseBody", reply_name, "body"):
            raise errors.ProtocolError(f"{body_name}: reply body type {body_type}")
        t = resp.Body()
        out = getattr(_convert.module(reply_name), reply_name)()
        out.Init(t.Bytes, t.Pos)
        return out

    def _dict(self, table, obj):
        return _convert.to_dict(table, obj)

    @staticmethod
    def _spec(job):
        """A JobSpecT from a dict or a job file's path."""
        if isinstance(job, (str, os.PathLike)):
            return load_job(job)
        return _convert.to_object("JobSpec", job, "job")

    # ----------------------------------------------------------------- API --

    def info(self):
        """ServerInfo: version, protocol, device, jobs_queued, jobs_running,
        uptime_seconds, kernels (what the server detected and picked: CPU,
        oneDNN ISA, SHA-256 code, GPU), and what newer servers add."""
        return self._dict("ServerInfoReply", self._call("ServerInfo", {}))

    def submit(self, job):
        """Submits a job - a dict in the JSON form of schema/job.fbs's JobSpec,
        or the path of a job file (its JSON text as flatc reads it, or its
        FlatBuffers binary) - and returns the new job's id. A spec the server
        refuses raises InvalidJob naming the field."""
        sub = _convert.module("SubmitJob").SubmitJobT()
        sub.spec = self._spec(job)
        return self._exchange("SubmitJob", sub).Job()

    def plan(self, job, stages=None, microbatches=None):
        """PlanJob: the server prices every flushing schedule (gpipe, 1f1b,
        zb-h1) of a job - a dict or a job file, as submit takes - at each of
        the stage and microbatch counts given (None: the job's), measuring
        the model's layers on its CPU: a list of Plan dicts (schedule,
        stages, microbatches, step_seconds, bubble, samples_per_second,
        boundaries, stage_bytes), fastest first."""
        req = _convert.module("PlanJob").PlanJobT()
        req.spec = self._spec(job)
        req.stages = list(stages) if stages else None
        req.microbatches = list(microbatches) if microbatches else None
        r = self._exchange("PlanJob", req, extra_wait=300.0)
        return [self._dict("Plan", r.Plans(i)) for i in range(r.PlansLength())]

    def get(self, job):
        """GetJob: the job's JobInfo as a dict (state by name, spec, last
        metric point, per-stage stats)."""
        return self._dict("JobInfo", self._call("GetJob", {"job": job}).Job())

    def list(self):
        """ListJobs: every job's JobInfo (without its spec), oldest first."""
        r = self._call("ListJobs", {})
        return [self._dict("JobInfo", r.Jobs(i)) for i in range(r.JobsLength())]

    def cancel(self, job):
        """CancelJob: returns the state the job will end in ("Cancelled"); a
        job already ended raises Conflict."""
        return _convert.enum_name("JobState", self._call("CancelJob", {"job": job}).State())

    def watch(self, job, cursor=-1, wait_ms=1000, max_points=1000):
        """Yields the job's metric points (dicts; eval_loss and eval_accuracy
        None where not evaluated) as they arrive, by WatchMetrics long polls,
        and returns when the job has ended; .get(job) then says how. Points
        after step cursor only (-1: from the start)."""
        while True:
            r = self._call("WatchMetrics", {"job": job, "cursor": cursor,
                                            "wait_ms": wait_ms, "max_points": max_points},
                           extra_wait=wait_ms / 1000.0)
            for i in range(r.PointsLength()):
                p = _convert.nan_to_none(self._dict("MetricPoint", r.Points(i)))
                if p["step"] > cursor:
                    cursor = p["step"]
                    yield p
            cursor = max(cursor, r.Cursor())
            if r.Ended():
                return

    def checkpoints(self, job):
        """ListCheckpoints: [{step, size, sha256}], oldest first."""
        r = self._call("ListCheckpoints", {"job": job})
        return [self._dict("CheckpointInfo", r.Checkpoints(i))
                for i in range(r.CheckpointsLength())]

    def workers(self):
        """ListWorkers: the server's pool workers (--pool) as dicts: url,
        state ("Idle", "Busy", "Unreachable", "Unknown"), job (0: none),
        draining, since_unix, last_heartbeat_unix, message. [] without a pool."""
        r = self._call("ListWorkers", {})
        return [self._dict("WorkerInfo", r.Workers(i)) for i in range(r.WorkersLength())]

    def drain_worker(self, url):
        """DrainWorker: the pool worker at url is lent to no more jobs (its
        current job finishes); an unknown url raises NotFound."""
        self._call("DrainWorker", {"url": url})

    def fetch_checkpoint(self, job, path, step=None, progress=None, chunk=FETCH_CHUNK):
        """Downloads checkpoint step (None: the latest) of job to path in
        ranges of chunk bytes (at most 4 MiB, the server's cap), into
        path + ".part" first: a download that stops
        (an error, or progress(done, total) returning False) keeps the .part
        and the next call resumes from it. The first range pins the step, so
        every range comes from one file; the whole file's SHA-256 must equal
        the server's (else ChecksumError, the .part removed). Returns
        {step, size, sha256}."""
        part = os.fspath(path) + ".part"
        with open(part, "ab"):
            pass
        step = -1 if step is None else step
        if not 0 < chunk <= FETCH_CHUNK:
            raise ValueError(f"chunk {chunk}: 1 to {FETCH_CHUNK} bytes")
        try:
            try:
                info = self._fetch_once(job, step, part, progress, chunk)
            except _Stale:
                os.truncate(part, 0)
                info = self._fetch_once(job, step, part, progress, chunk)
        except errors.ChecksumError:
            os.unlink(part)  # bad data: do not resume from it
            raise
        os.replace(part, path)
        return info

    def _fetch_once(self, job, step, part, progress, chunk):
        with open(part, "r+b") as f:
            off = start = os.fstat(f.fileno()).st_size
            h = hashlib.sha256()
            info = None
            while True:
                try:
                    r = self._call("FetchCheckpoint", {"job": job, "step": step,
                                                       "offset": off, "length": chunk})
                except errors.BadRequest:
                    if info is None and off > 0:
                        raise _Stale() from None  # most likely an offset past the end
                    raise
                d = self._dict("FetchCheckpointReply", r)
                if info is None:
                    step = d["step"]  # pin: later ranges come from this file
                    info = {"step": d["step"], "size": d["total_size"], "sha256": d["sha256"]}
                    if not info["sha256"] or len(info["sha256"]) != 64:
                        raise errors.ProtocolError("FetchCheckpoint: reply without a SHA-256")
                    if off > info["size"]:
                        raise _Stale()
                    f.seek(0)
                    left = off
                    while left:
                        piece = f.read(min(left, 1 << 20))
                        if not piece:
                            raise _Stale()
                        h.update(piece)
                        left -= len(piece)
                elif (d["total_size"], d["step"], d["sha256"]) != (info["size"], step,
                                                                   info["sha256"]):
                    raise errors.ProtocolError("FetchCheckpoint: the file changed during "
                                               "the download")
                data = d["data"]
                if d["offset"] != off or len(data) > info["size"] - off or \
                        (not data and off < info["size"]):
                    raise errors.ProtocolError(f"FetchCheckpoint: range at {d['offset']} of "
                                               f"{len(data)} bytes for offset {off}")
                f.seek(off)
                f.write(data)
                h.update(data)
                off += len(data)
                if progress is not None and progress(off, info["size"]) is False:
                    f.flush()
                    raise errors.PipetrainError(f"download stopped at {off} of "
                                                f"{info['size']} bytes; {part} is kept "
                                                f"for a resume")
                if off == info["size"]:
                    break
            f.flush()
            os.fsync(f.fileno())
        if h.hexdigest() != info["sha256"]:
            if start > 0:
                raise _Stale()
            raise errors.ChecksumError(f"checkpoint step {info['step']}: SHA-256 "
                                       f"{h.hexdigest()}, server says {info['sha256']}")
        return info


class _Stale(Exception):
    """A .part that belongs to another file: start again from nothing."""


def load_job(path):
    """Reads a job file - JSON text as flatc reads it, or a JobSpec
    FlatBuffers binary - into the generated JobSpecT."""
    with open(path, "rb") as f:
        data = f.read()
    if data.lstrip().lstrip(b"\xef\xbb\xbf").lstrip()[:1] in (b"{", b"/"):
        try:
            return _convert.to_object("JobSpec", _convert.loads_job(data.decode("utf-8")),
                                      "job")
        except ValueError as e:
            raise ValueError(f"{os.fspath(path)}: {e}") from None
    root = _convert.module("JobSpec").JobSpec.GetRootAs(bytearray(data), 0)
    return _convert.to_object("JobSpec", _convert.to_dict("JobSpec", root), "job")
