"""Every CLI error is one clear line and a non-zero exit, never a traceback (issue 15, item 14).

Run as real processes: a traceback is what a user would see on stderr, which an in-process runner
hides."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from offload.host.bundle import save
from offload.kernels.catalogue import entries

OFFLOAD = [sys.executable, "-m", "offload.cli"]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*OFFLOAD, *args], capture_output=True, text=True, timeout=timeout)


def _assert_one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, out
    for n in needles:
        assert n in errors[0], out


def _not_a_dir(tmp_path) -> str:
    """A path below a regular file: no process can create it, root included."""
    f = tmp_path / "file"
    f.write_text("x")
    return str(f / "sub")


@pytest.fixture()
def bundle(tmp_path):
    kernel = entries("mlp/16-8-1/ap_fixed16_6/r1/relu")[0].build().kernel
    return str(save([kernel], tmp_path / "b.offload"))


def test_serve_on_a_folder_that_is_not_a_bundle(tmp_path):
    (tmp_path / "empty").mkdir()
    _assert_one_line_error(_run("serve", str(tmp_path / "empty"), "--port", "1"), "manifest.json")


def test_serve_with_an_unknown_device(bundle):
    _assert_one_line_error(_run("serve", bundle, "--device", "bogus:0", "--port", "1"), "bogus")


def test_serve_with_a_bad_log_level(bundle):
    _assert_one_line_error(_run("serve", bundle, "--log-level", "loud", "--port", "1"), "log-level")


def test_bench_with_nothing_listening():
    with socket.socket() as s:  # a free port, closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _assert_one_line_error(_run("bench", f"http://127.0.0.1:{port}/v2/models/risk", "--rate", "10", "--duration", "0.5"))


def test_example_into_an_unwritable_path(tmp_path):
    _assert_one_line_error(_run("example", "risk", _not_a_dir(tmp_path)), "file")


def test_build_into_an_unwritable_path(bundle, tmp_path):
    _assert_one_line_error(_run("build", bundle, "--target", "u55c", "--out", _not_a_dir(tmp_path)), "file")


def test_regress_report_into_an_unwritable_path(tmp_path):
    p = _run("regress", "--kernel", "emb/sum/ap_fixed16_6/d16/bag20/t1", "--report", _not_a_dir(tmp_path) + "/r")
    _assert_one_line_error(p, "file")
