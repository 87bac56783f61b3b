"""Real moverd daemons for the Python tests and the pipeline (like
tests/harness.h's hd_start): each in a directory of its own, its socket
mode 0666, its log in the directory, over TCP on loopback."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """One moverd: start(), kill(), restart(), ctl(ARGS...)."""

    def __init__(self, moverd, moverctl, tag, listen=False):
        self.moverd, self.moverctl = moverd, moverctl
        self.dir = tempfile.mkdtemp(prefix=f"fm-py-{tag}-")
        self.sock = os.path.join(self.dir, "moverd.sock")
        self.log = os.path.join(self.dir, "moverd.log")
        self.port = free_port() if listen else 0
        self.proc = None

    @property
    def env(self):
        """The environment a client of this daemon runs with."""
        return dict(os.environ, FLOWMOVER_SOCKET=self.sock)

    def start(self):
        argv = [self.moverd, "--foreground", "--socket", self.sock,
                "--socket-mode", "0666", "--log-level", "info"]
        if self.port:
            argv += ["--listen", f"127.0.0.1:{self.port}",
                     "--transport", "tcp"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)
        for _ in range(1000):
            if self.proc.poll() is not None:
                raise RuntimeError(f"moverd exited at start: {self.tail()}")
            if self.ctl("status", check=False).returncode == 0 and (
                    not self.port or "listening for peers" in self.tail()):
                return self
            time.sleep(0.01)
        raise RuntimeError(f"moverd did not come up: {self.tail()}")

    def ctl(self, *args, check=True):
        r = subprocess.run([self.moverctl, "--socket", self.sock, *args],
                           capture_output=True, text=True, timeout=30)
        if check and r.returncode:
            raise RuntimeError(f"moverctl {' '.join(args)}: exit "
                               f"{r.returncode}: {r.stdout}{r.stderr}")
        return r

    def flow(self, name):
        """moverctl --json flow show NAME as a dict, or None."""
        r = self.ctl("--json", "flow", "show", name, check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def wait_flow(self, name, state=None, timeout=15):
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            self.alive()
            f = self.flow(name)
            if f and (state is None or f.get("state") == state):
                return f
            time.sleep(0.02)
        raise AssertionError(f"flow {name}: {self.flow(name)}, want "
                             f"state {state}")

    def alive(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"moverd died ({self.proc.returncode}): "
                                 f"{self.tail()}")

    def tail(self, n=4000):
        try:
            with open(self.log, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Pair:
    """Host A (producers) and host B (consumers, listening) on loopback."""

    def __init__(self, moverd, moverctl, tag="pair"):
        self.a = Daemon(moverd, moverctl, tag + "-a")
        self.b = Daemon(moverd, moverctl, tag + "-b", listen=True)

    def start(self):
        self.a.start()
        self.b.start()
        return self

    def create(self, name, ring_size="1M", max_record="64K"):
        """A flow from A to B, open on A and present on B."""
        self.a.ctl("flow", "create", name, "--peer",
                   f"127.0.0.1:{self.b.port}", "--ring-size", ring_size,
                   "--max-record", max_record)
        self.a.wait_flow(name, "open")
        self.b.wait_flow(name)

    def cleanup(self):
        self.a.cleanup()
        self.b.cleanup()
