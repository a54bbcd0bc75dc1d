"""What offload hands to Vitis: m_axi depths co-simulation can trust, the HLS front end of each
Vitis release, and connectivity in the form v++ documents."""

from __future__ import annotations

import re
import stat

import numpy as np
import pytest

from offload.hls import regress
from offload.hls.regress.synth import synth_entry
from offload.hls.vitis import hls_tool
from offload.hls.registry import get_hls_kind
from offload.kernels.catalogue import entries, load_golden

_PRAGMA = re.compile(r"#pragma HLS INTERFACE m_axi port = (\w+)[^\n]*")


def _depths(text: str) -> dict[str, int | None]:
    out = {}
    for m in _PRAGMA.finditer(text):
        d = re.search(r"depth = (\d+)", m.group(0))
        out[m.group(1)] = int(d.group(1)) if d else None
    return out


_CASES = [e.name for e in entries() if e.kind == "embedding"] + ["mlp/16-8-1/ap_fixed16_6/r1/relu", "mlp/32-16-8-1/ap_fixed16_6/r4/relu"]


@pytest.mark.parametrize("name", _CASES)
def test_every_m_axi_port_declares_a_depth_the_golden_vectors_fit(name):
    """UG1399: co-simulation reads an m_axi port only up to its declared depth."""
    g = load_golden(name)
    k = g.kernel()
    hk = get_hls_kind(k.kind)
    top = hk.top_name(k.spec)
    depths = _depths(hk.sources(k.spec)[f"{top}.cpp"])
    needed = {**hk.pack_resident(k.spec, k.tensors), **hk.pack_inputs(k.spec, g.inputs)}
    for a in hk.top_args(k.spec):
        if a.role == "scalar":
            continue
        assert depths.get(a.name) is not None, f"{name}: m_axi port {a.name} declares no depth"
        assert depths[a.name] >= np.asarray(needed[a.name]).size, (name, a.name, depths[a.name], np.asarray(needed[a.name]).size)


def _tool(tmp_path, name):
    script = tmp_path / "bin" / name
    script.parent.mkdir(exist_ok=True)
    script.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/{name}.args"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.parametrize("present, used, argv", [
    (("vitis-run",), "vitis-run", "--mode hls --tcl run.tcl"),  # Vitis 2024.2+
    (("vitis_hls",), "vitis_hls", "-f run.tcl"),  # older Vitis
    (("vitis-run", "vitis_hls"), "vitis-run", "--mode hls --tcl run.tcl"),
])
def test_csynth_uses_the_hls_front_end_vitis_has(tmp_path, monkeypatch, present, used, argv):
    for name in present:
        _tool(tmp_path, name)
    monkeypatch.delenv("VITIS_HLS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert regress.vitis_hls() == str(tmp_path / "bin" / used)
    name = "emb/sum/ap_fixed16_6/d16/bag20/t1"
    entry = entries(name)[0]
    synth, _ = synth_entry(entry, load_golden(name), tmp_path / "work", part=regress.DEFAULT_PART, clock_ns=4.0, cosim=False, timeout=60)
    assert (tmp_path / f"{used}.args").read_text().split() == argv.split()
    assert synth.status == "error"  # the stand-in tool writes no report


def test_vitis_hls_env_may_name_vitis_run(tmp_path, monkeypatch):
    tool = _tool(tmp_path, "vitis-run")
    monkeypatch.setenv("VITIS_HLS", str(tool))
    assert hls_tool().command("run.tcl") == [str(tool), "--mode", "hls", "--tcl", "run.tcl"]


def test_connectivity_uses_the_documented_nk_form(tmp_path):
    """v++ 2024.2+ documents nk=<kernel>:<count> (CUs <kernel>_1..N); the period-separated name list is not."""
    from offload.hls.build import write_project
    from offload.hls.connectivity import kernel_connectivity
    from offload.host.bundle import load, save

    e = entries("emb/sum/ap_fixed16_6/d16/bag20/t1")[0].build().kernel
    top = get_hls_kind(e.kind).top_name(e.spec)
    cfg = kernel_connectivity(e.spec, "u55c", compute_units=3)
    nk = [ln for ln in cfg.splitlines() if ln.startswith("nk=")]
    assert nk == [f"nk={top}:3"]
    assert {f"{top}_{i}" for i in (1, 2, 3)} <= set(re.findall(r"^sp=(\w+)\.", cfg, re.MULTILINE))
    project = write_project(load(save([e], tmp_path / "b")), "u55c", tmp_path / "prj", compute_units=2)
    nk = [ln for ln in (tmp_path / "prj" / "connectivity.cfg").read_text().splitlines() if ln.startswith("nk=")]
    assert nk == [f"nk={top}:2"]
    assert project.compute_units == {top: [f"{top}_1", f"{top}_2"]}


def test_cosim_refuses_golden_vectors_past_a_declared_depth(tmp_path, monkeypatch):
    """A golden batch larger than the provisioned co-simulation batch is an error before Vitis runs."""
    import offload.hls.mlp as hls_mlp

    _tool(tmp_path, "vitis_hls")
    monkeypatch.setenv("VITIS_HLS", str(tmp_path / "bin" / "vitis_hls"))
    name = "mlp/16-8-1/ap_fixed16_6/r1/relu"
    g = load_golden(name)
    assert regress.depth_shortfalls(g.kernel().spec, g.kernel().tensors, g.inputs) == []
    monkeypatch.setattr(hls_mlp, "COSIM_BATCH", 8)  # 24 golden samples
    assert regress.depth_shortfalls(g.kernel().spec, g.kernel().tensors, g.inputs) == [
        "port x gets 384 elements, its declared depth is 128", "port y gets 24 elements, its declared depth is 8"]
    _, cos = synth_entry(entries(name)[0], g, tmp_path / "work", part=regress.DEFAULT_PART, clock_ns=4.0, cosim=True, timeout=60)
    assert cos.status == "error" and "past the declared m_axi depth" in cos.detail
    assert not (tmp_path / "vitis_hls.args").exists()  # Vitis never started
