"""The README's demo sections that no other test runs."""

import io

import pytest
from rich.console import Console


@pytest.mark.slow
def test_mlp_section_checks_hls4ml_and_emu():
    from offload.demo import section_mlp

    buf = io.StringIO()
    assert section_mlp(Console(file=buf, width=140)) is True
    out = buf.getvalue()
    assert "bit-exact" in out and "hls4ml compile()+predict()" in out
