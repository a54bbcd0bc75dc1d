"""offload build: the Vitis project it writes, the golden C-simulation, and running (fake) v++."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import uuid
from dataclasses import replace

import numpy as np
import pytest
from _host_util import sa
from click.testing import CliRunner

from offload.cli import main
from offload.hls import build as hb
from offload.hls.registry import get_hls_kind, register_hls_kind
from offload.host.bundle import Bundle, load, save
from offload.kernels.registry import get_kind, register_kind

# A deliberately wrong kernel: its C++ adds 1 to column 3 of every row. The C-simulation must see it.
BROKEN = "test_scale_add_broken"


def _register_broken() -> None:
    try:
        get_kind(BROKEN)
        return
    except KeyError:
        pass
    good, hgood = get_kind(sa.KIND), get_hls_kind(sa.KIND)
    register_kind(replace(good, name=BROKEN, spec_from_json=lambda d: sa.ScaleAddSpec(int(d["n"]), int(d["scale"]), kind=BROKEN)))

    def sources(spec):
        (name, text), = hgood.sources(spec).items()
        return {name.replace("test_scale_add", BROKEN): text.replace("test_scale_add", BROKEN).replace("(uint32_t)bias[i])", "(uint32_t)bias[i] + (i == 3 ? 1u : 0u))")}

    register_hls_kind(replace(hgood, name=BROKEN, top_name=lambda spec: hgood.top_name(spec).replace("test_scale_add", BROKEN), sources=sources))


def _embedding_kernel():
    from offload.kernels.catalogue import entries

    return entries("emb/sum/ap_fixed16_6/d16/bag20/t1")[0].build().kernel


@pytest.fixture
def bundle_dir(tmp_path):
    ks = [sa.make_kernel("a", n=8, scale=3), sa.make_kernel("b", n=8, scale=3, seed=9), sa.make_kernel("c", n=4, scale=5)]
    return save(ks, tmp_path / "m.offload", meta={"model": "t"})


def test_project_layout_makefile_and_connectivity(bundle_dir, tmp_path):
    b = load(bundle_dir)
    proj = hb.write_project(b, "u55c", tmp_path / "prj", compute_units=2)
    root = proj.root
    tops = sorted(pk.top for pk in proj.kernels)
    # a and b share one top function (same spec); c has its own.
    assert tops == ["test_scale_add_n4_s5", "test_scale_add_n8_s3"]
    for top in tops:
        spec = next(k.spec for k in b.kernels.values() if get_hls_kind(k.kind).top_name(k.spec) == top)
        for name, text in get_hls_kind(sa.KIND).sources(spec).items():
            assert (root / "src" / top / name).read_text() == text
    mk = (root / "Makefile").read_text()
    assert re.search(r"^hw hw_emu sw_emu:", mk, re.M)
    assert "PLATFORM ?= xilinx_u55c_gen3x16_xdma_3_202210_1" in mk
    for top in tops:
        assert f"-k {top} " in mk and f"$(OUT)/{top}.xo:" in mk
    assert "$(VPP) -l $(VPP_COMMON) --config connectivity.cfg -o $@ $(XOS)" in mk
    cfg = (root / "connectivity.cfg").read_text().splitlines()
    assert "[connectivity]" in cfg
    for top in tops:
        assert f"nk={top}:2" in cfg and not any(ln.startswith(f"nk={top}:2:") for ln in cfg)
    sp = [ln[3:] for ln in cfg if ln.startswith("sp=")]
    # Every pointer argument of every CU is placed; arguments sharing an m_axi bundle share a bank,
    # distinct (CU, bundle) pairs get distinct HBM pseudo-channels (8 pairs <= 32 channels).
    assert len(sp) == 2 * 2 * 3
    banks = {}
    for line in sp:
        cuarg, bank = line.split(":")
        cu, arg = cuarg.split(".")
        bundle = {"bias": "gmem0", "x": "gmem1", "y": "gmem1"}[arg]
        banks.setdefault((cu, bundle), set()).add(bank)
    assert all(len(v) == 1 for v in banks.values())
    assert len({next(iter(v)) for v in banks.values()}) == len(banks)
    assert sum(ln.startswith("slr=") for ln in cfg) == 4
    readme = (root / "README.md").read_text()
    assert "make hw" in readme and "v++ -l" in readme
    assert (root / "include" / "nnet_utils").is_dir()
    meta = json.loads((root / "project.json").read_text())
    assert meta["platform"] == proj.platform and set(meta["steps"]) == {"sw_emu", "hw_emu", "hw"}


def test_ddr_card_keeps_cus_next_to_their_bank(bundle_dir, tmp_path):
    proj = hb.write_project(load(bundle_dir), "u250", tmp_path / "prj", compute_units=3)
    for pk in proj.kernels:
        for cu in pk.compute_units:
            slr = int(pk.slr[cu][3:])
            assert set(pk.banks[cu].values()) == {f"DDR[{slr}]"}
    with pytest.raises(ValueError, match="unknown card 'u9'"):
        hb.write_project(load(bundle_dir), "u9", tmp_path / "x")


def _mlp_kernel():
    from offload.kernels.catalogue import entries

    return next(e for e in entries() if e.kind == "mlp").build().kernel


def test_embedding_placement_comes_from_its_connectivity_generator(tmp_path):
    from offload.hls.connectivity import kernel_connectivity

    emb, mlp = _embedding_kernel(), _mlp_kernel()
    proj = hb.write_project(Bundle("m", {"mlp": mlp, "emb": emb}), "u55c", tmp_path / "prj", compute_units=2)
    cfg = (proj.root / "connectivity.cfg").read_text().splitlines()
    theirs = [ln for ln in kernel_connectivity(emb.spec, "u55c", compute_units=2).splitlines() if ln.startswith(("sp=", "slr=", "nk="))]
    assert set(theirs) <= set(cfg)
    bank = re.compile(r"HBM\[(\d+)\]")
    emb_top = get_hls_kind("embedding").top_name(emb.spec)
    emb_banks = {int(m) for ln in cfg if ln.startswith(f"sp={emb_top}") for m in bank.findall(ln)}
    mlp_banks = {int(m) for ln in cfg if ln.startswith("sp=offload_mlp") for m in bank.findall(ln)}
    assert mlp_banks and not (emb_banks & mlp_banks)  # the MLP's ports take the banks left over


def test_golden_check_passes_real_and_test_kernels():
    b = Bundle("m", {"sa": sa.make_kernel(n=8, scale=3), "emb": _embedding_kernel(), "mlp": _mlp_kernel()})
    res = hb.golden_check(b, cases=3)
    assert [r.kernel for r in res] == ["sa", "emb", "mlp"]
    for r in res:
        assert r.mismatches == 0 and r.compared > 0, r


def test_golden_check_catches_a_wrong_kernel():
    _register_broken()
    k = sa.make_kernel(n=8, scale=3)
    broken = replace(k, spec=sa.ScaleAddSpec(8, 3, kind=BROKEN))
    (r,) = hb.golden_check(Bundle("m", {"bad": broken}), cases=3)
    assert r.mismatches == 3 + 4 + 5  # one wrong element per row; batches of 3, 4, 5 rows
    assert r.first.startswith("case 0: y[0, 3]")


def _no_vpp_path() -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not os.path.exists(os.path.join(d, "v++")))


def test_cli_build_without_vitis_lists_the_steps_left(bundle_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _no_vpp_path())
    out = tmp_path / "prj"
    r = CliRunner().invoke(main, ["build", str(bundle_dir), "--target", "u280", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "Not run (no --vitis)" in r.output and f"cd {out} && make hw" in r.output
    assert "v++ -l -t hw --platform xilinx_u280_gen3x16_xdma_1_202211_1" in r.output
    assert (out / "Makefile").is_file()
    r = CliRunner().invoke(main, ["build", str(bundle_dir), "--target", "u280", "--out", str(out), "--vitis"])
    assert r.exit_code == 1
    assert "v++ not found on PATH" in r.output and "v++ -c -t hw" in r.output


def test_cli_build_refuses_a_kernel_that_misses_its_reference(tmp_path):
    _register_broken()
    k = sa.make_kernel(n=8, scale=3)
    p = save([replace(k, spec=sa.ScaleAddSpec(8, 3, kind=BROKEN))], tmp_path / "bad")
    r = CliRunner().invoke(main, ["build", str(p), "--target", "u55c", "--out", str(tmp_path / "prj")])
    assert r.exit_code == 1
    assert "C-simulation mismatches: sa: 12 (case 0: y[0, 3]" in r.output


_FAKE_VPP = r'''#!{python}
"""Test stand-in for v++: writes its -o output; FAKE_VPP_FAIL=c|l makes that mode fail like v++ does."""
import os, sys, uuid
args = sys.argv[1:]
out = args[args.index("-o") + 1]
mode = "c" if "-c" in args else "l"
print("INFO: [v++ 60-1548] Creating build summary session with primary output " + out, flush=True)
if os.environ.get("FAKE_VPP_FAIL") == mode:
    print("WARNING: [v++ 17-1525] a warning that is not the cause")
    print("ERROR: [v++ 60-399] vivado run failed, please look at the run log file")
    print("ERROR: [v++ 60-626] Kernel link failed to complete")
    sys.exit(1)
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
if mode == "c":
    open(out, "wb").write(b"PK fake xo")
    if os.environ.get("FAKE_VPP_REPORT"):  # where v++ --save-temps leaves Vitis HLS's report
        top = args[args.index("-k") + 1]
        tmp = args[args.index("--temp_dir") + 1]
        rep = os.path.join(tmp, top, top, top, "solution", "syn", "report")
        os.makedirs(rep, exist_ok=True)
        open(os.path.join(rep, "csynth.xml"), "w").write(open(os.environ["FAKE_VPP_REPORT"]).read())
elif os.environ.get("FAKE_VPP_XCLBIN") == "json":
    # The JSON xclbin stand-in that tests/fakes/pyxrt.py runs (a test artifact, not an xclbin).
    import json
    proj = json.load(open("project.json"))
    kernels = [{"name": k["top"], "kind": k["kind"], "spec": k["spec"], "cus": k["compute_units"]} for k in proj["kernels"]]
    json.dump({"format": "offload-test-fake-xclbin", "uuid": os.environ["FAKE_VPP_UUID"], "xsa": proj["platform"], "kernels": kernels}, open(out, "w"))
else:
    head = bytearray(b"\xff" * 448)
    head[:8] = b"xclbin2\0"
    head[416:432] = uuid.UUID(os.environ["FAKE_VPP_UUID"]).bytes
    open(out, "wb").write(bytes(head))
'''


@pytest.fixture
def fake_vpp(tmp_path, monkeypatch):
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "v++"
    exe.write_text(_FAKE_VPP.replace("{python}", sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(d) + os.pathsep + _no_vpp_path())
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # the UUID comes from the axlf header
    u = str(uuid.uuid4())
    monkeypatch.setenv("FAKE_VPP_UUID", u)
    assert shutil.which("v++") == str(exe)
    return u


def test_cli_build_vitis_failure_shows_the_tools_error_lines(bundle_dir, tmp_path, fake_vpp, monkeypatch):
    monkeypatch.setenv("FAKE_VPP_FAIL", "l")
    out = tmp_path / "prj"
    r = CliRunner().invoke(main, ["build", str(bundle_dir), "--target", "u55c", "--out", str(out), "--vitis"])
    assert r.exit_code == 1
    assert "link failed (exit 1)" in r.output
    assert "ERROR: [v++ 60-399] vivado run failed" in r.output and "ERROR: [v++ 60-626] Kernel link failed" in r.output
    assert "a warning that is not the cause" not in r.output.split("link failed")[1]
    log = out / "logs" / "hw" / "link.log"
    assert str(log) in r.output.replace("\n", "") and "ERROR: [v++ 60-626]" in log.read_text()
    assert load(bundle_dir).xclbin is None


def test_cli_build_vitis_records_the_xclbin(bundle_dir, tmp_path, fake_vpp, monkeypatch):
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "hls-reports" / "vitis-2020.2-gaussian" / "csynth.xml"
    monkeypatch.setenv("FAKE_VPP_REPORT", str(fixture))
    out = tmp_path / "prj"
    r = CliRunner().invoke(main, ["build", str(bundle_dir), "--target", "u55c", "--out", str(out), "--vitis", "--cus", "2"])
    assert r.exit_code == 0, r.output
    b = load(bundle_dir)
    assert b.xclbin is not None and b.xclbin.name == "offload.xclbin"
    assert b.xclbin_uuid == fake_vpp and b.target == "u55c" and b.platform == "xilinx_u55c_gen3x16_xdma_3_202210_1"
    assert b.compute_units["test_scale_add_n8_s3"] == ["test_scale_add_n8_s3_1", "test_scale_add_n8_s3_2"]
    assert (out / "build" / "hw" / "test_scale_add_n4_s5.xo").is_file()
    assert f"UUID {fake_vpp}" in r.output
    # Vitis HLS's reports are collected per top function (parsed by offload.hls.reports).
    reports = json.loads((out / "reports_hw.json").read_text())
    # `offload build` writes the persistent tops (<top>_ring) next to the per-call ones by default.
    assert set(reports) == {"test_scale_add_n8_s3", "test_scale_add_n4_s5", "test_scale_add_n8_s3_ring", "test_scale_add_n4_s5_ring"}
    assert reports["test_scale_add_n4_s5"]["latency_max"] == 262673 and reports["test_scale_add_n4_s5"]["resources"]["LUT"] == 1870
    assert "C-synthesis estimates" in r.output and "262673" in r.output
    # The recorded xclbin is checksummed like every other file of the bundle.
    data = b.xclbin.read_bytes()
    b.xclbin.write_bytes(data[:-1] + b"\0")
    with pytest.raises(ValueError, match="offload.xclbin does not match its sha256"):
        load(bundle_dir)


def test_save_build_record_and_run_on_the_card_stand_in(tmp_path, fake_vpp, monkeypatch):
    """The whole flow: save -> offload build --vitis (fake v++ emitting the JSON xclbin stand-in)
    -> offload info -> the bundle runs on the xrt backend (pyxrt stand-in) exactly like sim."""
    from _host_util import FAKES, assert_same

    from offload.host import open_device

    ks = [sa.make_kernel("a", n=8, scale=3), _embedding_kernel()]
    p = save(ks, tmp_path / "m.offload")
    monkeypatch.setenv("FAKE_VPP_XCLBIN", "json")
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delitem(sys.modules, "pyxrt")  # the fixture blocked it; now the stand-in
    try:
        r = CliRunner().invoke(main, ["build", str(p), "--target", "u280", "--out", str(tmp_path / "prj"), "--vitis", "--cus", "2"])
        assert r.exit_code == 0, r.output
        b = load(p)
        assert b.xclbin_uuid == fake_vpp and b.target == "u280"
        r = CliRunner().invoke(main, ["info", str(p)])
        assert fake_vpp in r.output and "u280" in r.output
        dev, sim = open_device("xrt:0"), open_device("sim")
        hx, hs = dev.load_bundle(b), sim.load_bundle(b)
        inputs = {"a": sa.make_inputs(n=8, batch=3), b.kernels[ks[1].name].name: hb.golden_inputs(ks[1].spec, np.random.default_rng(1), 1)}
        for name, inp in inputs.items():
            for _ in range(2):
                assert_same(dev.run(hx[name], inp), sim.run(hs[name], inp))
        dev.close()
    finally:
        sys.modules.pop("pyxrt", None)


def test_rerun_skips_up_to_date_steps_and_rebuilds_on_change(bundle_dir, tmp_path, fake_vpp):
    """After `make hw` (here: a first run), a rerun of offload build --vitis only records; a
    changed kernel source makes its compile and the link run again."""
    out = tmp_path / "prj"
    args = ["build", str(bundle_dir), "--target", "u55c", "--out", str(out), "--vitis"]
    assert CliRunner().invoke(main, args).exit_code == 0
    logs = sorted((out / "logs" / "hw").iterdir())
    stamps = {p.name: p.stat().st_mtime_ns for p in logs}
    xclbin = out / "build" / "hw" / "offload.xclbin"
    first = xclbin.stat().st_mtime_ns
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert {p.name: p.stat().st_mtime_ns for p in logs} == stamps and xclbin.stat().st_mtime_ns == first
    # Touch one kernel's source (newer than its .xo): that compile and the link rerun, not the other compile.
    src = next((out / "src" / "test_scale_add_n4_s5").iterdir())
    os.utime(src, ns=(first + 10**9, first + 10**9))
    assert CliRunner().invoke(main, args).exit_code == 0
    changed = {p.name for p in logs if p.stat().st_mtime_ns != stamps[p.name]}
    assert changed == {"compile_test_scale_add_n4_s5.log", "link.log"}
