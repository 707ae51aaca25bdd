#!/usr/bin/python3
"""soak.py - a bounded soak of pipeserver under kill -9 (`make soak`).

Starts a real `pipeserver` (fixed loopback port, its own data dir and files
root) and two `pipeserver --worker` processes, runs every distinct job spec
once undisturbed (the reference losses and checkpoint data hashes), then for
the chaos phase lets client threads submit, watch, cancel, list and fetch
checkpoints at random through build/client/pipeclient while a chaos thread
kill -9s the server or a worker at random times and restarts it. Then it
stops the chaos, lets every job end and checks the invariants:

  - every acknowledged job (submit printed an id) is listed, under its name;
  - every job ended Succeeded with each step's loss bitwise equal to its
    spec's reference, or Cancelled, or Failed with a non-empty message (a
    lost worker, "server died twice while running this job", ...); the
    steps a cancelled or failed job did report equal the reference too.
    Async jobs apply updates as gradients arrive, so their losses depend on
    timing: for them every step must be present once and finite;
  - a cancel the server answered with Cancelled stays Cancelled;
  - every fetched checkpoint hashes (SHA-256, computed here) to what the
    server stated, its safetensors data section hashes to its own
    __metadata__.data_sha256, and that data hash equals the reference run's
    checkpoint of the same spec and step (recovery is bitwise);
  - no descriptor or memory growth: every idle process (server, workers)
    after the soak has at most FD_SLACK more descriptors than before it and
    a worker at most RSS_SLACK_MIB more RssAnon; the server's memory grows
    with the jobs it holds, so the idle server after the soak is compared
    with three fresh recoveries (kill -9, restart) of the same data dir,
    which must agree on descriptors exactly and on RssAnon within
    FRESH_SLACK_MIB, and which it may exceed by RSS_SLACK_MIB at most.

Figures and a `N passed, N failed` line go to stdout; the exit status is 1 on
any violation. Everything random comes from --seed (printed; each thread
draws from its own stream seed+k, so a thread's sequence of decisions
reproduces; the interleaving with kills depends on timing).

usage: soak.py [--build DIR] [--seconds N] [--seed N] [--keep]
SOAK_SECONDS and SOAK_SEED set the defaults (600 s, time-based seed).
"""
import argparse
import collections
import concurrent.futures
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

FD_SLACK = 4  # descriptors an idle server or worker may gain over the soak
RSS_SLACK_MIB = 48  # resident memory an idle server or worker may gain
FRESH_SLACK_MIB = 8  # spread of the server's memory over fresh recoveries of one data dir
MAX_ACTIVE = 4  # queued or running jobs the clients keep at most
CLIENT_THREADS = 3
REQ_TIMEOUT = "5"  # seconds per pipeclient request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log(msg):
    print("[%7.1f] %s" % (time.monotonic() - T0, msg), flush=True)


T0 = time.monotonic()

# ------------------------------------------------------------------ specs --


def base_spec(name, stages, steps, every, mode="Sync", **kw):
    spec = {
        "name": name,
        "model": [
            {"kind": "Linear", "in_features": 64, "out_features": 128},
            {"kind": "ReLU"},
            {"kind": "Linear", "in_features": 128, "out_features": 64},
            {"kind": "ReLU"},
            {"kind": "Linear", "in_features": 64, "out_features": 10},
        ],
        "data": {"format": "Npy", "features": "digits_x.npy", "labels": "digits_y.npy",
                 "held_out": 0.2},
        "loss": "CrossEntropy",
        "optimizer": {"kind": "AdamW", "lr": 0.002, "weight_decay": 0.01},
        "batch_size": 64,
        "microbatches": 4,
        "steps": steps,
        "mode": mode,
        "placement": {"stages": stages, "threads_per_stage": 1},
        "checkpoint": {"every_steps": every, "keep": 3},
        "seed": 7,
        "eval_every": 0,
    }
    for k, v in kw.items():
        if k in ("workers", "worker_timeout_ms"):
            spec["placement"][k] = v
        else:
            spec[k] = v
    return spec


def make_specs(w1, w2):
    """The distinct specs: (key, spec, bitwise). Async jobs update weights as
    gradients arrive (docs/pipeline.md), so their losses depend on timing and
    are checked for completeness and finiteness only, not bitwise."""
    sgd = {"kind": "SGD", "lr": 0.05, "momentum": 0.9}
    wt = 2000  # worker_timeout_ms: a worker abandoned by a killed server is free after it
    return [
        ("local-sync-2", base_spec("", 2, 600, 80), True),
        ("local-semi-3", base_spec("", 3, 480, 60, mode="SemiAsync", seed=11), True),
        ("local-async-2", base_spec("", 2, 400, 50, mode="Async", seed=3), False),
        ("local-1-sgd", base_spec("", 1, 800, 100, optimizer=sgd, seed=5), True),
        ("local-2-graphs", base_spec("", 2, 600, 120, use_graphs=True, recompute=True,
                                     eval_every=200), True),
        ("workers-sync-2", base_spec("", 2, 400, 50, workers=[w1, w2],
                                     worker_timeout_ms=wt), True),
        ("workers-semi-2", base_spec("", 2, 320, 40, mode="SemiAsync", compress=True,
                                     workers=[w2, w1], worker_timeout_ms=wt, seed=9), True),
        ("workers-1-spare", base_spec("", 1, 400, 50, workers=[w1, w2], worker_timeout_ms=wt,
                                      max_restarts=1, seed=13), True),
    ]


# -------------------------------------------------------------- processes --


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def proc_stat(pid):
    """(descriptors, RssAnon KiB, VmRSS KiB) of pid, or None when it is gone.
    RssAnon is VmRSS without file-backed and shared pages: the heap, stacks
    and anonymous maps, where a leak shows; VmRSS also counts the pages of
    oneDNN and the other libraries the process happened to touch, which vary
    by tens of MiB between two starts of the same idle server."""
    try:
        fds = len(os.listdir("/proc/%d/fd" % pid))
        v = {}
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, rest = line.partition(":")
                if k in ("RssAnon", "VmRSS"):
                    v[k] = int(rest.split()[0])
        return fds, v["RssAnon"], v["VmRSS"]
    except (OSError, ValueError, KeyError):
        return None


class Proc:
    """A pipeserver (or --worker) on a fixed port, restartable after kill -9."""

    def __init__(self, name, binary, args, port, workdir):
        self.name, self.binary, self.args = name, binary, args
        self.url = "tcp://127.0.0.1:%d" % port
        self.workdir = workdir
        self.p = None
        self.starts = 0
        self.lock = threading.Lock()

    def start(self, deadline=30.0):
        out = os.path.join(self.workdir, "%s.out" % self.name)
        err = open(os.path.join(self.workdir, "%s.log" % self.name), "a")
        t_end = time.monotonic() + deadline
        while True:
            open(out, "w").close()
            with open(out, "a") as o:
                p = subprocess.Popen([self.binary, "--listen", self.url] + self.args,
                                     stdout=o, stderr=err, stdin=subprocess.DEVNULL,
                                     cwd=self.workdir)
            while time.monotonic() < t_end:
                with open(out) as f:
                    if "pipeserver listening on" in f.read():
                        self.p = p
                        self.starts += 1
                        err.close()
                        return
                if p.poll() is not None:
                    break
                time.sleep(0.02)
            if p.poll() is None:
                p.kill()
            p.wait()
            if time.monotonic() >= t_end:
                err.close()
                raise RuntimeError("%s did not start (see %s.log)" % (self.name, self.name))
            time.sleep(0.3)  # the port may still be held; try again

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def kill9(self):
        if self.alive():
            self.p.send_signal(signal.SIGKILL)
            self.p.wait()
            return True
        return False

    def stop(self):
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()

    def stat(self):
        return proc_stat(self.p.pid) if self.alive() else None


# ----------------------------------------------------------------- client --


class Soak:
    def __init__(self, a):
        self.a = a
        self.build = os.path.abspath(a.build)
        self.server_bin = os.path.join(self.build, "server", "pipeserver")
        self.client_bin = os.path.join(self.build, "client", "pipeclient")
        self.dir = tempfile.mkdtemp(prefix="pt-soak-")
        self.files = os.path.join(self.dir, "files")
        self.data = os.path.join(self.dir, "data")
        self.dl = os.path.join(self.dir, "downloads")
        self.specdir = os.path.join(self.dir, "specs")
        for d in (self.files, self.dl, self.specdir):
            os.makedirs(d)
        for f in ("digits_x.npy", "digits_y.npy"):
            shutil.copy(os.path.join(ROOT, "examples", "data", f), self.files)
        self.mu = threading.Lock()
        self.stop_chaos = threading.Event()
        self.stop_clients = threading.Event()
        self.requests = collections.Counter()  # (command, outcome)
        self.violations = []
        self.bad_checks = set()
        self.lost = collections.Counter()  # what was lost, by kind (must stay empty)
        self.worker_pids = {}  # worker name -> pid at the idle sample before the chaos
        self.kills = collections.Counter()
        self.restarts = collections.Counter()
        self.subs = []  # dicts: name, key, id (None: not acknowledged)
        self.by_id = {}
        self.cancel_acked = set()  # ids whose cancel reply said Cancelled
        self.fetched = 0
        self.fetch_bytes = 0
        self.ckpt_seen = {}  # (key, step) -> data sha256 seen in chaos fetches
        self.ref = {}  # key -> {"losses": [...], "ckpt": {step: data_sha}}
        self.samples = collections.defaultdict(list)  # proc name -> [(pid, fds, rss)]
        self.seq = 0

    # -- bookkeeping
    def violation(self, check, what):
        """Records a broken invariant under check (a job, "checkpoints", ...)."""
        with self.mu:
            self.violations.append(what)
            self.bad_checks.add(check)
        log("VIOLATION: " + what)

    def pc(self, args, timeout=20.0, kind=None):
        """Runs pipeclient; returns (exit status, stdout). 124: our wall limit."""
        cmd = [self.client_bin, "--server", self.server.url, "--timeout", REQ_TIMEOUT,
               "--json"] + args
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            rc, out = r.returncode, r.stdout
        except subprocess.TimeoutExpired as e:
            rc = 124
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        outcome = {0: "ok", 3: "unreachable", 4: "rejected", 5: "job-not-ok",
                   124: "cut"}.get(rc, "error%d" % rc)
        with self.mu:
            self.requests[(kind or args[0], outcome)] += 1
        return rc, out

    def write_spec(self, key, spec, name, keep=None):
        s = json.loads(json.dumps(spec))
        s["name"] = name
        if keep is not None:
            s["checkpoint"]["keep"] = keep
        if not self.has_files_root:
            for k in ("features", "labels"):
                s["data"][k] = os.path.join(self.files, s["data"][k])
        path = os.path.join(self.specdir, name + ".json")
        with open(path, "w") as f:
            json.dump(s, f)
        return path

    def submit(self, key, spec, name, keep=None):
        path = self.write_spec(key, spec, name, keep)
        sub = {"name": name, "key": key, "id": None}
        with self.mu:
            self.subs.append(sub)
        rc, out = self.pc(["submit", path])
        if rc == 0:
            sub["id"] = json.loads(out.strip().splitlines()[-1])["job"]
            with self.mu:
                self.by_id[sub["id"]] = sub
        return sub

    def list_jobs(self):
        rc, out = self.pc(["list"])
        if rc != 0:
            return None
        return json.loads(out.strip().splitlines()[-1])["jobs"]

    def losses(self, jid):
        """The job's metric points as {step: loss}, or None."""
        rc, out = self.pc(["watch", str(jid)], timeout=60)
        if rc not in (0, 5):
            return None
        pts = {}
        for line in out.splitlines():
            o = json.loads(line)
            if o.get("type") == "metric":
                if o["step"] in pts:
                    self.violation("job %d" % jid, "job %d: step %d reported twice by watch" % (jid, o["step"]))
                pts[o["step"]] = o["loss"]
        return pts

    def fetch(self, jid, key, step=None, path=None):
        """Fetches a checkpoint and checks it; returns the path or None."""
        if path is None:
            with self.mu:
                self.seq += 1
                n = self.seq
            path = os.path.join(self.dl, "j%d-%d.safetensors" % (jid, n))
        args = ["checkpoint", str(jid), "-o", path]
        if step is not None:
            args[2:2] = ["--step", str(step)]
        rc, out = self.pc(args, timeout=30)
        if rc == 1 and "sha" in out.lower():
            self.violation("checkpoints", "job %d: pipeclient reports a checksum mismatch: %s" %
                           (jid, out.strip()))
            return None
        if rc != 0:
            return None
        o = json.loads(out.strip().splitlines()[-1])
        with open(path, "rb") as f:
            blob = f.read()
        os.unlink(path)
        with self.mu:
            self.fetched += 1
            self.fetch_bytes += len(blob)
        if hashlib.sha256(blob).hexdigest() != o["sha256"] or len(blob) != o["size"]:
            self.violation("checkpoints", "job %d step %d: served checkpoint hashes to %s (%d bytes), the "
                           "server stated %s (%d bytes)" % (jid, o["step"],
                                                            hashlib.sha256(blob).hexdigest(),
                                                            len(blob), o["sha256"], o["size"]))
            return None
        if step is not None and o["step"] != step:
            self.violation("checkpoints", "job %d: asked for step %d, got %d" % (jid, step, o["step"]))
        data_sha = self.check_safetensors(jid, o["step"], blob)
        if data_sha is None:
            return None
        ref = self.ref.get(key, {}).get("ckpt", {}).get(o["step"])
        if ref is not None and ref != data_sha:
            self.violation("checkpoints", "job %d (%s) step %d: checkpoint data %s differs from the "
                           "reference %s" % (jid, key, o["step"], data_sha, ref))
        with self.mu:
            self.ckpt_seen[(key, o["step"])] = data_sha
        return o

    def check_safetensors(self, jid, step, blob):
        """Checks the file's own data_sha256 and step; returns the data hash."""
        try:
            (hl,) = struct.unpack("<Q", blob[:8])
            hdr = json.loads(blob[8:8 + hl])
            meta = hdr["__metadata__"]
            data = blob[8 + hl:]
            got = hashlib.sha256(data).hexdigest()
        except (ValueError, KeyError, struct.error) as e:
            self.violation("checkpoints", "job %d step %d: served checkpoint is not safetensors: %s" %
                           (jid, step, e))
            return None
        if meta.get("data_sha256") != got:
            self.violation("checkpoints", "job %d step %d: data hashes to %s, __metadata__ says %s" %
                           (jid, step, got, meta.get("data_sha256")))
            return None
        if meta.get("step") != str(step):
            self.violation("checkpoints", "job %d: checkpoint of step %d says step %s" %
                           (jid, step, meta.get("step")))
        return got

    # -- processes
    def start_procs(self):
        help_text = subprocess.run([self.server_bin, "--help"], capture_output=True,
                                   text=True).stdout
        self.has_files_root = "--files-root" in help_text
        sargs = ["--data-dir", self.data, "--threads", "1", "--watch-interval-ms", "50"]
        if self.has_files_root:
            sargs += ["--files-root", self.files]
        self.workers = [Proc("worker%d" % (i + 1), self.server_bin, ["--worker"], free_port(),
                             self.dir) for i in range(2)]
        self.server = Proc("server", self.server_bin, sargs, free_port(), self.dir)
        for p in self.workers + [self.server]:
            p.start()
        self.procs = {p.name: p for p in self.workers + [self.server]}
        log("server %s (pid %d), workers %s; data %s; --files-root %s" % (
            self.server.url, self.server.p.pid, ", ".join(w.url for w in self.workers),
            self.dir, "passed" if self.has_files_root else "not supported: absolute paths"))

    def sample(self, tag):
        for p in self.procs.values():
            with p.lock:
                st = p.stat()
                if st:
                    self.samples[(p.name, tag)].append((p.p.pid,) + st)

    def wait_final(self, ids, deadline):
        """Polls until every job in ids is final; returns the last list."""
        while True:
            jobs = self.list_jobs()
            if jobs is not None:
                states = {j["id"]: j["state"] for j in jobs}
                if all(states.get(i) in FINAL for i in ids):
                    return jobs
            if time.monotonic() > deadline:
                return jobs
            time.sleep(0.25)

    def wait_idle_workers(self):  # noqa: D401
        # A worker whose coordinator died keeps its session for the job's
        # worker_timeout_ms (2 s) before it is idle again.
        time.sleep(3.0)

    # -- phases
    def references(self):
        for key, spec, bitwise in self.specs:
            sub = self.submit(key, spec, "ref-" + key, keep=1000)
            if sub["id"] is None:
                raise RuntimeError("reference submit of %s failed" % key)
            jobs = self.wait_final([sub["id"]], time.monotonic() + 120)
            j = [j for j in jobs if j["id"] == sub["id"]][0]
            if j["state"] != "Succeeded":
                raise RuntimeError("reference %s ended %s: %s" % (key, j["state"],
                                                                  j["message"]))
            pts = self.losses(sub["id"])
            steps = spec["steps"]
            if sorted(pts) != list(range(1, steps + 1)):
                raise RuntimeError("reference %s: steps %s" % (key, sorted(pts)))
            rc, out = self.pc(["checkpoints", str(sub["id"])])
            cks = json.loads(out.strip().splitlines()[-1])["checkpoints"]
            self.ref[key] = {"losses": pts, "ckpt": {}, "bitwise": bitwise}
            for c in cks:
                o = self.fetch(sub["id"], key, c["step"])
                if o is None:
                    raise RuntimeError("reference %s: fetch of step %d failed" %
                                       (key, c["step"]))
                if bitwise:
                    self.ref[key]["ckpt"][c["step"]] = self.ckpt_seen[(key, c["step"])]
            log("reference %-16s job %3d: %d steps, final loss %.6f, %d checkpoints%s" % (
                key, sub["id"], steps, pts[steps], len(cks),
                "" if bitwise else " (async: not compared bitwise)"))

    def inject_faults(self):
        """--inject: proves the checks can fail. Flips one byte in the data
        of the first reference job's newest checkpoint on disk (same size, so
        the server keeps its stored hash) and fetches it; and moves the
        reference loss of the first spec's step 1 by one ulp, so every job
        of that spec must be reported."""
        key = self.specs[0][0]
        ck = os.path.join(self.data, "jobs", "1", "checkpoints")
        newest = max((f for f in os.listdir(ck) if f.endswith(".safetensors")),
                     key=lambda f: int(f[5:-12]))
        with open(os.path.join(ck, newest), "r+b") as f:
            f.seek(-1, os.SEEK_END)
            b = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([b[0] ^ 1]))
        log("inject: flipped the last byte of job 1's %s; fetching it" % newest)
        self.fetch(1, key)
        loss = self.ref[key]["losses"][1]
        bits = struct.unpack("<q", struct.pack("<d", loss))[0] + 1
        self.ref[key]["losses"][1] = struct.unpack("<d", struct.pack("<q", bits))[0]
        log("inject: reference loss of %s step 1 moved from %r to %r" % (
            key, loss, self.ref[key]["losses"][1]))

    def chaos(self, rng):
        """kill -9 at random times; three times in four the moment is moved
        to when a job the victim serves is running past its first checkpoint."""
        while not self.stop_chaos.is_set():
            if self.stop_chaos.wait(rng.uniform(self.a.kill_min, self.a.kill_max)):
                break
            r = rng.random()
            targets = (["server"] if r < 0.55 else
                       ["worker%d" % rng.randint(1, 2)] if r < 0.9 else
                       ["server", "worker%d" % rng.randint(1, 2)])
            if rng.random() < 0.75:
                self.await_victim(targets, rng)
            for t in targets:
                p = self.procs[t]
                with p.lock:
                    if p.kill9():
                        self.kills[t] += 1
                        log("kill -9 %s" % t)
            time.sleep(rng.uniform(0.1, 3.0))
            for t in targets:
                p = self.procs[t]
                with p.lock:
                    if not p.alive():
                        p.start()
                        self.restarts[t] += 1
                        st = p.stat()
                        if st:
                            self.samples[(t, "restart")].append((p.p.pid,) + st)

    def await_victim(self, targets, rng):
        """Waits (at most 8 s) for a running job that a kill of targets hits
        after its first checkpoint, then a random 0..0.5 s more."""
        workers = any(t.startswith("worker") for t in targets)
        every = {k: spec["checkpoint"]["every_steps"] for k, spec, _ in self.specs}
        t_end = time.monotonic() + 8
        while time.monotonic() < t_end and not self.stop_chaos.is_set():
            jobs = self.list_jobs() or []
            with self.mu:
                key_of = {s["name"]: s["key"] for s in self.subs}
            for j in jobs:
                key = key_of.get(j["name"])
                if (j["state"] == "Running" and key is not None and j["step"] > every[key] and
                        (not workers or key.startswith("workers-"))):
                    time.sleep(rng.uniform(0.0, 0.5))
                    return
            time.sleep(0.1)

    def client(self, k, rng):
        keys = [s[0] for s in self.specs]
        spec_of = {s[0]: s[1] for s in self.specs}
        while not self.stop_clients.is_set():
            with self.mu:
                known = [s for s in self.subs if s["id"] is not None and
                         not s["name"].startswith("ref-")]
            r = rng.random()
            if r < 0.22:
                jobs = self.list_jobs()
                if jobs is not None:
                    active = [j for j in jobs if j["state"] not in FINAL]
                    if len(active) < MAX_ACTIVE:
                        key = rng.choice(keys)
                        with self.mu:
                            self.seq += 1
                            name = "soak-%d-%s" % (self.seq, key)
                        sub = self.submit(key, spec_of[key], name)
                        if sub["id"] is not None:
                            log("client %d: submitted %s as job %d" % (k, name, sub["id"]))
            elif not known:
                time.sleep(0.2)
            elif r < 0.40:
                self.pc(["status", str(rng.choice(known)["id"])])
            elif r < 0.55:
                # A watch cut off after a random time (or at the job's end).
                self.pc(["watch", str(rng.choice(known)["id"])],
                        timeout=rng.uniform(0.5, 6.0))
            elif r < 0.62:
                s = rng.choice(known[-6:])
                rc, out = self.pc(["cancel", str(s["id"])])
                if rc == 0:
                    st = json.loads(out.strip().splitlines()[-1])["state"]
                    if st == "Cancelled":
                        with self.mu:
                            self.cancel_acked.add(s["id"])
                    log("client %d: cancel job %d -> %s" % (k, s["id"], st))
            elif r < 0.85:
                s = rng.choice(known[-8:])
                step = None
                if rng.random() < 0.5:
                    rc, out = self.pc(["checkpoints", str(s["id"])])
                    if rc == 0:
                        cks = json.loads(out.strip().splitlines()[-1])["checkpoints"]
                        if cks:
                            step = rng.choice(cks)["step"]
                self.fetch(s["id"], s["key"], step)
            elif r < 0.92:
                self.pc(["info"])
            else:
                self.list_jobs()
            time.sleep(rng.uniform(0.0, 0.3))

    def verify(self, jobs):
        listed = {j["id"]: j for j in jobs}
        outcomes = collections.Counter()
        reasons = collections.Counter()
        for s in self.subs:
            if s["id"] is None:
                continue
            if s["id"] not in listed:
                self.violation("listed", "job %d (%s): acknowledged but not listed" %
                               (s["id"], s["name"]))
                self.lost["acknowledged jobs not listed"] += 1
            elif listed[s["id"]]["name"] != s["name"]:
                self.violation("listed", "job %d: listed as %r, submitted as %r" %
                               (s["id"], listed[s["id"]]["name"], s["name"]))
                self.lost["acknowledged jobs not listed"] += 1
        names = {s["name"]: s for s in self.subs}
        unacked = 0
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            all_pts = dict(zip([j["id"] for j in jobs], ex.map(self.losses,
                                                                 [j["id"] for j in jobs])))
        for j in jobs:
            jid, st, check = j["id"], j["state"], "job %d" % j["id"]
            s = names.get(j["name"])
            if s is None:
                self.violation(check, "job %d: unknown name %r" % (jid, j["name"]))
                continue
            if s["id"] != jid:
                unacked += 1  # the submit's reply was lost, not the job
            key = s["key"]
            ref = self.ref[key]
            outcomes[st] += 1
            if st == "Failed":
                reasons[reason_class(j["message"])] += 1
                if not j["message"]:
                    self.violation(check, "job %d failed without a reason" % jid)
            elif st not in ("Succeeded", "Cancelled"):
                self.violation(check, "job %d ended %s: %s" % (jid, st, j["message"]))
            if jid in self.cancel_acked and st != "Cancelled":
                self.violation(check, "job %d: cancel was answered Cancelled, job ended %s" %
                               (jid, st))
                self.lost["acknowledged cancels undone"] += 1
            pts = all_pts[jid]
            if pts is None:
                self.violation(check, "job %d: watch failed" % jid)
                continue
            if st == "Succeeded" and sorted(pts) != sorted(ref["losses"]):
                self.violation(check, "job %d (%s): steps %s, the spec has 1..%d" %
                               (jid, key, compress_steps(pts), len(ref["losses"])))
                self.lost["finished jobs with steps missing"] += 1
            if st != "Succeeded" and pts and sorted(pts) != list(range(1, max(pts) + 1)):
                self.violation(check, "job %d (%s): steps %s have gaps" %
                               (jid, key, compress_steps(pts)))
                self.lost["jobs with steps missing"] += 1
            for step, loss in sorted(pts.items()):
                if ref["bitwise"]:
                    bad = step not in ref["losses"] or not same(loss, ref["losses"][step])
                else:
                    bad = step not in ref["losses"] or loss is None or loss != loss
                if bad:
                    self.violation(check, "job %d (%s) step %d: loss %r, reference %r" %
                                   (jid, key, step, loss, ref["losses"].get(step)))
                    break
        return outcomes, reasons, unacked

    def sample_idle(self, tag):
        """Samples descriptors and memory of every process once all are idle."""
        self.wait_idle_workers()
        for p in self.procs.values():
            st = p.stat()
            if st:
                self.samples[(p.name, tag)].append((p.p.pid,) + st)

    def fresh_restarts(self, n):
        """kill -9 and restart the idle server n times: recovery of the same
        data dir must come back to the same descriptors and memory."""
        for k in range(n):
            self.server.kill9()
            self.server.start()
            while self.list_jobs() is None:
                time.sleep(0.2)
            time.sleep(2.0)
            st = self.server.stat()
            if st:
                self.samples[("server", "fresh")].append((self.server.p.pid,) + st)

    def run(self):
        a = self.a
        deadline = time.monotonic() + a.seconds
        log("seed %d, %d s (chaos ends %d s before)" % (a.seed, a.seconds, a.drain))
        self.start_procs()
        self.specs = make_specs(self.workers[0].url, self.workers[1].url)
        self.references()
        if a.inject:
            self.inject_faults()
        self.sample_idle("idle-before")
        log("references done; chaos until %.0f s" % (a.seconds - a.drain))

        threads = [threading.Thread(target=self.guard, args=(self.chaos, random.Random(a.seed)))]
        threads += [threading.Thread(target=self.guard,
                                     args=(self.client, k, random.Random(a.seed + 1 + k)))
                    for k in range(CLIENT_THREADS)]
        for t in threads:
            t.start()
        while time.monotonic() < deadline - a.drain:
            time.sleep(1.0)
            self.sample("chaos")
        self.stop_chaos.set()
        self.stop_clients.set()
        for t in threads:
            t.join()

        # Drain: everything up again, every job to its end.
        log("chaos over; draining")
        for p in self.procs.values():
            if not p.alive():
                p.start()
                self.restarts[p.name] += 1
        jobs = None
        while jobs is None:
            jobs = self.list_jobs()
        ids = [j["id"] for j in jobs]
        chaos_end = deadline - a.drain
        jobs = self.wait_final(ids, chaos_end + 0.4 * a.drain)
        for j in jobs:
            if j["state"] not in FINAL:
                log("drain: job %d still %s at the drain deadline; cancelling it" %
                    (j["id"], j["state"]))
                self.pc(["cancel", str(j["id"])])
        jobs = self.wait_final(ids, chaos_end + 0.55 * a.drain)
        self.sample_idle("idle-after")
        outcomes, reasons, unacked = self.verify(jobs)
        self.fresh_restarts(3)
        self.check_growth()
        self.report(jobs, outcomes, reasons, unacked)
        print("soak wall time: %.0f s (SOAK_SECONDS %.0f)" % (time.monotonic() - T0, a.seconds))

    def guard(self, fn, *args):
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - the driver's own bug fails the soak
            import traceback
            traceback.print_exc()
            self.violation("driver", "%s: %r" % (fn.__name__, e))

    def check_growth(self):
        """Descriptors and memory of idle processes, before and after the soak."""
        bounds = []
        for name in ("server", "worker1", "worker2"):
            before = self.samples.get((name, "idle-before"))
            after = self.samples.get((name, "idle-after"))
            if not before or not after:
                self.violation(name + " growth", "%s: no idle sample" % name)
                continue
            (p0, f0, r0, v0), (p1, f1, r1, v1) = before[-1], after[-1]
            rs = self.samples.get((name, "restart"), []) + self.samples.get((name, "chaos"), [])
            log("%s: idle %d fds, RssAnon %.1f MiB (VmRSS %.1f) before (pid %d); %d fds, %.1f MiB "
                "(VmRSS %.1f) after (pid %d%s); during the chaos fds %s, RssAnon MiB %s" % (
                    name, f0, r0 / 1024, v0 / 1024, p0, f1, r1 / 1024, v1 / 1024, p1,
                    ", the same process" if p0 == p1 else ", restarted",
                    span([x[1] for x in rs]), span([x[2] / 1024 for x in rs])))
            if f1 > f0 + FD_SLACK:
                self.violation(name + " growth", "%s: %d descriptors when idle after the soak, "
                               "%d before (bound +%d)" % (name, f1, f0, FD_SLACK))
            if name != "server" and r1 > r0 + RSS_SLACK_MIB * 1024:
                self.violation(name + " growth", "%s: RssAnon %.1f MiB when idle after the soak, "
                               "%.1f MiB before (bound +%d MiB)" % (
                                   name, r1 / 1024, r0 / 1024, RSS_SLACK_MIB))
        # The server's memory grows with the jobs it holds (metric points),
        # so its bounds compare with fresh recoveries of the same data dir.
        fresh = self.samples.get(("server", "fresh"), [])
        after = self.samples.get(("server", "idle-after"))
        if len(fresh) < 2 or not after:
            self.violation("server growth", "server: no samples of fresh recoveries")
            return
        ff = [x[1] for x in fresh]
        fr = [x[2] / 1024 for x in fresh]
        r1 = after[-1][2] / 1024
        log("server: %d fresh recoveries of the final data dir: fds %s, RssAnon MiB %s "
            "(VmRSS MiB %s); the server before them %.1f MiB" % (
                len(fresh), span(ff), span(fr), span([x[3] / 1024 for x in fresh]), r1))
        if max(ff) - min(ff) > 0:
            self.violation("server growth", "server: descriptors after recovery vary: %s" % ff)
        if max(fr) - min(fr) > FRESH_SLACK_MIB:
            self.violation("server growth", "server: RssAnon after recovery varies by more than "
                           "%d MiB: %s" % (FRESH_SLACK_MIB, fr))
        if r1 > max(fr) + RSS_SLACK_MIB:
            self.violation("server growth", "server: RssAnon %.1f MiB after the soak, %.1f MiB "
                           "after a fresh recovery of the same jobs (bound +%d MiB)" % (
                               r1, max(fr), RSS_SLACK_MIB))

    def report(self, jobs, outcomes, reasons, unacked):
        n_req = sum(self.requests.values())
        by_kind = collections.Counter()
        by_out = collections.Counter()
        for (k, o), n in self.requests.items():
            by_kind[k] += n
            by_out[o] += n
        chaos_subs = [s for s in self.subs if not s["name"].startswith("ref-")]
        print("soak seed: %d (SOAK_SEED=%d reproduces each thread's decisions)" % (
            self.a.seed, self.a.seed))
        print("soak jobs: %d listed (%d references); %d submits in the chaos, %d acknowledged, "
              "%d more present though their reply was lost" % (
                  len(jobs), len(self.specs), len(chaos_subs),
                  sum(1 for s in chaos_subs if s["id"] is not None), unacked))
        print("soak outcomes: " + ", ".join("%s %d" % kv for kv in sorted(outcomes.items())))
        if reasons:
            print("soak failure reasons: " + "; ".join("%s: %d" % kv
                                                       for kv in sorted(reasons.items())))
        print("soak cancels answered Cancelled: %d" % len(self.cancel_acked))
        print("soak kills (kill -9): server %d, worker %d (worker1 %d, worker2 %d)" % (
            self.kills["server"], self.kills["worker1"] + self.kills["worker2"],
            self.kills["worker1"], self.kills["worker2"]))
        print("soak restarts: server %d, worker %d (then 3 more kill -9 and restarts of the "
              "idle server to measure recovery)" % (
                  self.restarts["server"], self.restarts["worker1"] + self.restarts["worker2"]))
        print("soak requests: %d pipeclient runs (%s); outcomes: %s" % (
            n_req, ", ".join("%s %d" % kv for kv in sorted(by_kind.items())),
            ", ".join("%s %d" % kv for kv in sorted(by_out.items()))))
        print("soak checkpoints fetched: %d (%.1f MiB), each SHA-256 computed here; %d distinct "
              "(spec, step)" % (self.fetched, self.fetch_bytes / 1048576, len(self.ckpt_seen)))
        try:
            with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        print("soak recoveries (server log): %d resumed from a checkpoint, %d restarted from "
              "step 0, %d succeeded after restarts on a spare worker" % (
                  text.count("resuming from the checkpoint of step"),
                  text.count("restarting: no checkpoint to resume from"),
                  text.count("succeeded after")))
        print("soak lost: %d%s" % (sum(self.lost.values()), "".join(
            " (%s %d)" % kv for kv in sorted(self.lost.items()))))
        checks = (["listed", "checkpoints", "driver"] + ["job %d" % j["id"] for j in jobs] +
                  ["server growth", "worker1 growth", "worker2 growth"])
        failed = [c for c in checks if c in self.bad_checks]
        extra = self.bad_checks - set(checks)
        print("soak violations: %d" % len(self.violations))
        for v in self.violations:
            print("  " + v)
        print("%d passed, %d failed" % (len(checks) - len(failed), len(failed) + len(extra)))
        self.failed = bool(self.violations)

    def shutdown(self):
        for p in getattr(self, "procs", {}).values():
            p.stop()
        if self.a.keep:
            print("soak files kept in %s" % self.dir)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


FINAL = ("Succeeded", "Failed", "Cancelled", "Interrupted")


def same(a, b):
    if a is None or b is None:
        return a is None and b is None
    return struct.pack("<d", a) == struct.pack("<d", b)


def span(v):
    return "-" if not v else ("%g..%g" % (min(v), max(v)))


def compress_steps(pts):
    s = sorted(pts)
    return "%d points, %s" % (len(s), span(s))


def reason_class(msg):
    for words in ("server died twice", "no heartbeat", "handshake", "refused", "busy",
                  "lost", "connection", "closed", "timed out"):
        if words in msg:
            return words
    return msg[:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", "0")) or
                    int(time.time()) % 1000000)
    ap.add_argument("--kill-min", type=float, default=4.0, help="seconds between kills, least")
    ap.add_argument("--kill-max", type=float, default=15.0, help="seconds between kills, most")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--inject", action="store_true",
                    help="corrupt a checkpoint on disk and a reference loss: the soak must fail")
    a = ap.parse_args()
    # After the chaos: let jobs end (up to 40 % of this), cancel what is
    # left, verify (one watch per job) and measure 3 fresh recoveries.
    a.drain = min(120.0, max(45.0, a.seconds * 0.2))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # SIGTERM (make's timeout, Ctrl-C) still stops our processes and cleans up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    s = Soak(a)
    s.failed = True
    try:
        s.run()
    except Exception as e:  # noqa: BLE001 - a setup failure is a failed soak
        import traceback
        traceback.print_exc()
        print("soak aborted: %s" % e)
        print("0 passed, 1 failed")
    finally:
        s.stop_chaos.set()
        s.stop_clients.set()
        s.shutdown()
    sys.exit(1 if s.failed else 0)


if __name__ == "__main__":
    main()
