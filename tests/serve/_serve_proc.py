"""Real ``offload serve`` processes for the hostile-input tests: start one on a free loopback
port, wait until it answers, read its metrics, stop it. All traffic stays on 127.0.0.1."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
OFFLOAD = [sys.executable, "-m", "offload.cli"]
HOSTILE = [sys.executable, str(HERE / "_hostile_serve.py")]
_BUNDLE: list[str] = []


def risk_bundle() -> str:
    """The example risk bundle (``offload example risk``), trained once per test process."""
    if not _BUNDLE:
        import torch

        from offload.examples.risk import build_risk_bundle

        torch.set_num_threads(1)  # the machine is shared: training is small, threads only contend
        d = tempfile.mkdtemp(prefix="offload-hostile-")
        atexit.register(shutil.rmtree, d, True)
        build_risk_bundle(f"{d}/risk", n_train=2000, n_test=500)  # scores need not be good here
        _BUNDLE.append(f"{d}/risk")
    return _BUNDLE[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``offload serve`` process; ``url`` is its base URL, ``log()`` its stderr so far."""

    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc, self.port, self._log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.auth: dict[str, str] = {}

    def log(self) -> str:
        return self._log.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """``name{labels}`` -> value, labels sorted as Prometheus renders them."""
        text = httpx.get(f"{self.url}/metrics", headers=self.auth, timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, v = line.rpartition(" ")
                out[key] = float(v)
        return out

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM, then the exit status; a process still alive after ``timeout`` is killed and fails."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"server ignored SIGTERM for {timeout} s; log:\n{self.log()[-3000:]}") from None


@contextlib.contextmanager
def serving(*args: str, hostile: bool = False, nofile: int | None = None, api_key: str | None = None):
    """``offload serve BUNDLE --port P ARGS...`` (through ``_hostile_serve.py`` when ``hostile``),
    optionally under an open-file limit of ``nofile``; yields a :class:`Server` once it answers."""
    port = free_port()
    cmd = [*(HOSTILE if hostile else OFFLOAD), "serve", risk_bundle(), "--port", str(port), *args]
    if api_key:
        cmd += ["--api-key", api_key]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("OFFLOAD_API_KEY", None)
    log = Path(tempfile.mkstemp(prefix="offload-serve-", suffix=".log")[1])

    def limit_files():  # runs in the child: the limit applies to the server only
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, preexec_fn=limit_files if nofile else None)
    srv = Server(proc, port, log)
    srv.auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        end = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {srv.log()[-3000:]}")
            try:
                if httpx.get(f"{srv.url}/v2/health/live", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"server did not start: {srv.log()[-3000:]}")
            time.sleep(0.05)
        yield srv
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.unlink(missing_ok=True)


def raw_request(port: int, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Sends ``data`` on a fresh connection and returns everything the server sends back until it
    closes or goes quiet for ``timeout`` s."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)
        return read_all(s)


def read_all(s: socket.socket) -> bytes:
    """What the server sends until it closes (or resets) the connection or goes quiet."""
    return read_until_close(s)[0]


def read_until_close(s: socket.socket) -> tuple[bytes, bool]:
    """What the server sends, and True if it closed or reset the connection (False: it went
    quiet for the socket's timeout with the connection still open)."""
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    except socket.timeout:
        return b"".join(chunks), False
    return b"".join(chunks), True


def status_of(response: bytes) -> int | None:
    m = re.match(rb"HTTP/1\.[01] (\d{3})", response)
    return int(m.group(1)) if m else None
