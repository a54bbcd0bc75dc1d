"""The README's demo (``offload demo``): the sections no other test runs, and what a section prints."""

import importlib.util
import io
import subprocess
import sys

import pytest
from rich.console import Console


@pytest.mark.slow
def test_mlp_section_checks_hls4ml_and_emu():
    from offload.demo import section_mlp

    buf = io.StringIO()
    assert section_mlp(Console(file=buf, width=140)) is True
    out = buf.getvalue()
    assert "bit-exact" in out and "hls4ml compile()+predict()" in out


_PARTITION_SECTION = """
import sys
from rich.console import Console
from offload.demo.partition import partition_demo_section
sys.exit(0 if partition_demo_section(Console(width=300), full=False) else 1)
"""


def test_partition_section_passes_its_checks_and_prints_no_library_warning():
    """The partitioning section (its TorchRec variant included where torchrec is installed) in a fresh
    process with Python's default warning filters, as ``offload demo`` runs it: torch logs its
    ``is_fx_tracing`` notice once a process and pytest keeps Python warnings off stderr, so only a
    fresh process shows what a user would see. Nothing may reach stderr."""
    proc = subprocess.run([sys.executable, "-c", _PARTITION_SECTION], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "8 tables offloaded (1 table-batched call)" in out and "offload advise" in out
    if importlib.util.find_spec("torchrec") is not None:
        assert "TorchRec DLRM: EBC" in out
    assert proc.stderr == "", proc.stderr
    assert "Warning" not in out, out
