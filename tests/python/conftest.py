"""Fixtures: a real pipeserver (PIPESERVER, started per test module) on
loopback with the checkout (or root) as its files root."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


class Server:
    def __init__(self, token=None, root=ROOT, extra=()):
        self.dir = tempfile.mkdtemp(prefix="pt-py-")
        args = [os.environ["PIPESERVER"], "--listen", "tcp://127.0.0.1:0",
                "--data-dir", os.path.join(self.dir, "data"), "--files-root", root]
        if token is not None:
            path = os.path.join(self.dir, "token")
            with open(path, "w") as f:
                f.write(token + "\n")
            os.chmod(path, 0o600)
            args += ["--auth-token-file", path]
        args += list(extra)
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     text=True)
        line = self.proc.stdout.readline()
        m = re.match(r"pipeserver listening on (\S+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"pipeserver did not start: {line!r}")
        self.url = m.group(1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Worker(Server):
    """`pipeserver --worker` on loopback."""

    def __init__(self):
        super().__init__(extra=("--worker",))


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def fresh_server():
    s = Server()
    yield s
    s.stop()


def wait_for(pred, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False
