"""`offload regress`: golden-vector checks, regeneration, synthesis baselines (fake vitis_hls), reports.

The C-simulation cases use two small embedding entries (one compile each, cached in
$OFFLOAD_CACHE_DIR); the synthesis path runs against a fake ``vitis_hls`` that writes a real
Vitis HLS 2020.2 report (tests/fixtures/hls-reports) where the tool would.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from offload.cli.regress import regress as regress_cmd
from offload.hls import regress as R
from offload.hls.regress.synth import entry_dir
from offload.hls.reports import parse_xml
from offload.kernels import catalogue as C

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "hls-reports" / "vitis-2020.2-gaussian" / "csynth.xml"
# Two cheap entries of different kinds of arithmetic: a saturating narrow accumulator and row-wise int8.
PICK = ["emb/sum/ap_fixed16_6-accsat18_8/d16/bag20/t1", "emb/max/int8_rowwise/d16/bag20/t1"]
SEL = ["--kernel", PICK[0], "--kernel", PICK[1]]


def _invoke(args, env=None):
    # Wide enough that rich never folds an entry name across lines.
    res = CliRunner().invoke(regress_cmd, args, env={"COLUMNS": "200", **(env or {})}, catch_exceptions=False)
    return res.exit_code, res.output


def _copy_golden(tmp_path: Path, names=PICK) -> Path:
    """A golden dir with only ``names`` (files copied, index filtered)."""
    src = C.golden_dir()
    dst = tmp_path / "golden"
    dst.mkdir()
    index = json.loads((src / C.INDEX).read_text())
    keep = {n: index["entries"][n] for n in names}
    for meta in keep.values():
        shutil.copy(src / meta["file"], dst / meta["file"])
    (dst / C.INDEX).write_text(json.dumps({"format": 1, "entries": keep}))
    return dst


def _rewrite_npz(path: Path, edit) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k].copy() for k in z.files}
    edit(arrays)
    np.savez_compressed(path, **arrays)


# ---------------------------------------------------------------- units


def test_tolerances_parse():
    t = R.Tolerances.parse("latency=0.02, resources=0.2")
    assert (t.latency, t.resources, t.clock) == (0.02, 0.2, R.Tolerances().clock)
    assert t.for_metric("interval_max") == 0.02 and t.for_metric("LUT") == 0.2 and t.for_metric("estimated_clock_ns") == t.clock
    with pytest.raises(ValueError, match="'speed': unknown"):
        R.Tolerances.parse("speed=1")
    with pytest.raises(ValueError, match="not a number"):
        R.Tolerances.parse("latency=fast")
    with pytest.raises(ValueError, match=">= 0"):
        R.Tolerances.parse("latency=-1")


def test_compare_baseline_verdicts():
    tol = R.Tolerances(latency=0.05, resources=0.10)
    base = {"latency_max": 1000, "LUT": 2000, "DSP": 0}
    # +4.9 % latency and +10 % LUT sit inside the limits.
    assert R.compare_baseline({"latency_max": 1049, "LUT": 2200, "DSP": 0}, base, tol).status == "pass"
    reg = R.compare_baseline({"latency_max": 1051, "LUT": 2000, "DSP": 0}, base, tol)
    assert reg.status == "regression" and "latency_max 1000 -> 1051" in reg.detail
    # A resource going from 0 to 1 counts as +100 %.
    assert R.compare_baseline({"latency_max": 1000, "LUT": 2000, "DSP": 1}, base, tol).status == "regression"
    imp = R.compare_baseline({"latency_max": 900, "LUT": 2000, "DSP": 0}, base, tol)
    assert imp.status == "improvement" and imp.data["deltas"]["latency_max"]["relative"] == pytest.approx(-0.1)
    assert R.compare_baseline({"LUT": 1}, None, tol).status == "no-baseline"


def test_compare_outputs_names_the_first_difference():
    exp = {"out": np.arange(12, dtype=np.int64).reshape(3, 4)}
    got = {"out": exp["out"].copy()}
    assert R.compare_outputs(got, exp).status == "pass"
    got["out"][2, 1] += 1
    c = R.compare_outputs(got, exp)
    assert c.status == "fail" and "1 of 12 values differ (first at [2, 1]: got 10, expected 9)" in c.detail
    assert R.compare_outputs({"out": exp["out"][:2]}, exp).status == "fail"
    assert "missing" in R.compare_outputs({}, exp).detail


def test_synthesis_tcl_commands_in_order():
    tcl = R.synthesis_tcl("topf", ["/a/k.cpp"], part="xcu55c-fsvh2892-2L-e", clock_ns=3.333, testbench="/a/tb.cpp",
                          tb_args="/a/data", include_dirs=["/inc"], cosim=True)
    cmds = [ln.split()[0] for ln in tcl.splitlines()]
    assert cmds == ["open_project", "set_top", "add_files", "add_files", "open_solution", "set_part", "create_clock",
                    "csynth_design", "cosim_design", "exit"]
    assert "set_top topf" in tcl and "set_part {xcu55c-fsvh2892-2L-e}" in tcl and "-period 3.333" in tcl
    assert 'add_files -tb {/a/tb.cpp} -cflags "-std=c++14 -I/inc"' in tcl and "cosim_design -argv {/a/data}" in tcl
    assert "cosim_design" not in R.synthesis_tcl("t", ["k.cpp"], part="p", clock_ns=4)


def test_report_paths():
    from offload.cli.regress import _report_paths

    assert _report_paths("out/r") == (Path("out/r.json"), Path("out/r.md"))
    assert _report_paths("out/r.json") == (Path("out/r.json"), Path("out/r.md"))
    assert _report_paths("out/") == (Path("out/regress.json"), Path("out/regress.md"))


def test_regenerate_reports_a_broken_entry_and_writes_the_others(tmp_path, monkeypatch):
    good = C.entries(PICK[0])[0]

    def boom(entry, rng):
        raise ValueError("table t0: bad format")

    bad = C.Entry("emb/broken", "embedding", {}, boom)
    changes = R.regenerate([good, bad], root=tmp_path)
    assert changes[good.name] == {"new": True}
    assert "ValueError: table t0: bad format" in changes["emb/broken"]["error"]
    assert set(C.read_index(tmp_path)) == {good.name}


def test_selection_patterns():
    names = [e.name for e in C.entries("emb/max/")]
    assert names and all(n.startswith("emb/max/") for n in names)
    assert [e.name for e in C.entries(PICK[0])] == [PICK[0]]
    assert {e.name for e in C.entries("*/int8_rowwise/*")} >= {PICK[1]}
    code, out = _invoke(["--kernel", "no/such/*"])
    assert code != 0 and "no catalogue entry matches" in out


# ---------------------------------------------------------------- golden checks through the CLI


def test_regress_passes_and_writes_reports(tmp_path):
    code, out = _invoke(["--kernel", PICK[0], "--kernel", PICK[1], "-j", "2", "--report", str(tmp_path / "rep")])
    assert code == 0, out
    data = json.loads((tmp_path / "rep.json").read_text())
    assert data["ok"] and [r["name"] for r in data["results"]] == PICK
    for r in data["results"]:
        assert {k: c["status"] for k, c in r["checks"].items()} == {"golden": "pass", "sim": "pass", "csim": "pass"}
        assert r["checks"]["csim"]["data"]["mismatches"] == {"out": 0}
    md = (tmp_path / "rep.md").read_text()
    assert "**PASS**" in md and f"`{PICK[0]}`" in md
    assert "PASS" in out


def test_corrupted_golden_output_fails_naming_the_entry(tmp_path):
    root = _copy_golden(tmp_path)
    victim = PICK[1]

    def flip(a):
        a["o.out"][3, 5] += 1

    _rewrite_npz(C.golden_path(victim, root), flip)
    code, out = _invoke(["--golden-dir", str(root), *SEL, "--report", str(tmp_path / "r")])
    assert code == 1
    assert victim in out and PICK[0] in out
    data = json.loads((tmp_path / "r.json").read_text())
    res = {r["name"]: r for r in data["results"]}
    assert res[PICK[0]]["status"] == "pass"
    bad = res[victim]["checks"]
    # Both the C-simulation and the reference model disagree with the corrupted value, at that spot only.
    assert bad["csim"]["status"] == bad["sim"]["status"] == "fail"
    assert bad["csim"]["data"]["mismatches"] == {"out": 1} and "first at [3, 5]" in bad["csim"]["detail"]
    # The catalogue still builds the same inputs and tensors: the golden record is not "stale", it is wrong.
    assert bad["golden"]["status"] == "pass"


def test_stale_and_missing_golden(tmp_path):
    root = _copy_golden(tmp_path)

    def bump_input(a):
        a["i.indices"][0] = (a["i.indices"][0] + 1) % 97

    _rewrite_npz(C.golden_path(PICK[0], root), bump_input)
    index = json.loads((root / C.INDEX).read_text())
    del index["entries"][PICK[1]]
    (root / C.INDEX).write_text(json.dumps(index))
    code, out = _invoke(["--golden-dir", str(root), *SEL, "--report", str(tmp_path / "r"), "--device", "none"])
    assert code == 1
    res = {r["name"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    g0 = res[PICK[0]]["checks"]["golden"]
    assert g0["status"] == "fail" and "stale" in g0["detail"] and g0["data"]["diff"] == {"inputs.indices": 1}
    g1 = res[PICK[1]]["checks"]["golden"]
    assert g1["status"] == "error" and "no golden vectors" in g1["detail"]
    assert "csim" not in res[PICK[0]]["checks"]  # --device none


def test_regenerate_reports_changes(tmp_path):
    root = tmp_path / "g"
    code, out = _invoke(["--regenerate", "--golden-dir", str(root), "--kernel", PICK[0], "--kernel", PICK[1]])
    assert code == 0, out
    assert f"{PICK[0]}: new" in out and "2 of 2 entries changed" in out
    assert C.read_index(root).keys() == set(PICK)
    # Same seeds, same vectors, bit for bit, as the committed ones.
    for n in PICK:
        a, b = C.load_golden(n, root), C.load_golden(n)
        assert C.diff_golden(b, a) == {}

    def flip3(a):
        a["o.out"][0, :3] += 7

    _rewrite_npz(C.golden_path(PICK[1], root), flip3)
    # Only the expected outputs differ (same kernel, same inputs): the reference changed, which is
    # what golden vectors exist to catch. Refused without a reason, and nothing is written.
    before = C.golden_path(PICK[1], root).read_bytes()
    code, out = _invoke(["--regenerate", "--golden-dir", str(root), "--kernel", PICK[0], "--kernel", PICK[1]])
    assert code == 1 and f"{PICK[1]}: REFUSED (outputs.out: 3 values differ)" in out, out
    assert "0 of 2 entries changed" in out and C.golden_path(PICK[1], root).read_bytes() == before
    code, out = _invoke(["--regenerate", "--golden-dir", str(root), "--kernel", PICK[0], "--kernel", PICK[1], "--reason", "test: outputs restored"])
    assert code == 0 and f"{PICK[1]}: outputs.out: 3 values differ" in out and "1 of 2 entries changed" in out
    assert C.diff_golden(C.load_golden(PICK[1]), C.load_golden(PICK[1], root)) == {}
    # A full regeneration without --kernel prunes entries that left the catalogue.
    index = json.loads((root / C.INDEX).read_text())
    index["entries"]["emb/gone"] = dict(index["entries"][PICK[0]], file="gone.npz")
    (root / C.INDEX).write_text(json.dumps(index))
    changes = R.regenerate(C.entries(PICK), root=root, prune=True)
    assert changes["emb/gone"] == {"removed": True} and "emb/gone" not in C.read_index(root)


def test_npz_is_loaded_without_pickle(tmp_path):
    root = _copy_golden(tmp_path, [PICK[0]])
    path = C.golden_path(PICK[0], root)
    np.savez(path, **{"o.out": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(C.GoldenError, match="cannot read"):
        C.load_golden(PICK[0], root)


# ---------------------------------------------------------------- synthesis / co-simulation


def _fake_vitis(tmp_path: Path, *, cosim_corrupt: bool = False) -> Path:
    """A stand-in ``vitis_hls -f run.tcl``: writes the real fixture report where Vitis HLS puts it,
    and for cosim_design compiles and runs the testbench with g++ (as the C side of cosim does)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "vitis_hls"
    exe.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import pathlib, re, shutil, subprocess, sys
        import numpy as np
        tcl = pathlib.Path(sys.argv[sys.argv.index("-f") + 1]).read_text()
        pathlib.Path("fake.log").write_text(tcl)
        proj = re.search(r"open_project -reset (\\S+)", tcl).group(1)
        sol = re.search(r"open_solution -reset (\\S+)", tcl).group(1)
        assert "csynth_design" in tcl
        rep = pathlib.Path(proj) / sol / "syn" / "report"
        rep.mkdir(parents=True)
        shutil.copy({str(FIX)!r}, rep / "csynth.xml")
        print("INFO: [HLS 200-111] Finished Command csynth_design")
        if "cosim_design" in tcl:
            from offload.hls import csim
            tb, flags = re.search(r'add_files -tb \\{{([^}}]+)\\}} -cflags "([^"]*)"', tcl).groups()
            srcs = re.findall(r"add_files \\{{([^}}]+)\\}}", tcl)
            incs = [f[2:] for f in flags.split() if f.startswith("-I")]
            prog = csim.build([tb, *srcs], include_dirs=incs)
            data = re.search(r"cosim_design -argv \\{{([^}}]*)\\}}", tcl).group(1)
            rc = subprocess.run([str(prog), data]).returncode
            if {cosim_corrupt!r}:
                out = next(pathlib.Path(data).glob("*.out.bin"))
                raw = bytearray(out.read_bytes()); raw[0] ^= 1; out.write_bytes(bytes(raw))
            if rc:
                print("ERROR: [COSIM 212-359] Aborting co-simulation: C TB simulation failed.")
                sys.exit(1)
            print("INFO: [COSIM 212-1000] *** C/RTL co-simulation finished: PASS ***")
        """))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bindir


def _path_without_vitis(tmp_path: Path) -> str:
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if not ((Path(p) / "vitis_hls").exists() or (Path(p) / "vitis-run").exists()))


def test_csynth_without_vitis_is_a_clear_skip(tmp_path):
    code, out = _invoke(["--kernel", PICK[0], "--csynth", "--device", "none", "--report", str(tmp_path / "r")],
                        env={"PATH": _path_without_vitis(tmp_path), "VITIS_HLS": ""})
    assert code == 0
    assert "neither vitis-run nor vitis_hls is on PATH" in " ".join(out.split())
    c = json.loads((tmp_path / "r.json").read_text())["results"][0]["checks"]["csynth"]
    assert c["status"] == "skipped" and "neither vitis-run nor vitis_hls is on PATH" in c["detail"]


def _baseline(tmp_path: Path, part: str, metrics: dict) -> Path:
    d = tmp_path / "baselines"
    R.write_baselines(part, 3.333, "vitis_hls 2020.2", {PICK[0]: metrics}, d)
    return d


@pytest.mark.parametrize("scale,expect_status,expect_code", [(1.0, "pass", 0), (0.8, "regression", 1), (1.25, "improvement", 0)])
def test_csynth_compares_with_baseline(tmp_path, scale, expect_status, expect_code):
    bindir = _fake_vitis(tmp_path)
    part = "xcu55c-fsvh2892-2L-e"
    measured = parse_xml(FIX).metrics()  # what the fake tool's report says
    # Baseline = report x scale on latency_max only: 0.8 makes the report 25 % worse (> 5 %), 1.25 makes it 20 % better.
    base = dict(measured, latency_max=round(measured["latency_max"] * scale))
    bdir = _baseline(tmp_path, part, base)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "VITIS_HLS": ""}
    work = tmp_path / "work"
    code, out = _invoke(["--kernel", PICK[0], "--csynth", "--device", "none", "--part", part, "--baselines-dir", str(bdir),
                         "--workdir", str(work), "--report", str(tmp_path / "r")], env=env)
    assert code == expect_code, out
    c = json.loads((tmp_path / "r.json").read_text())["results"][0]["checks"]["csynth"]
    assert c["status"] == expect_status
    assert c["data"]["metrics"]["LUT"] == 1870 and c["data"]["deltas"]["latency_max"]["baseline"] == base["latency_max"]
    tcl = (entry_dir(work, PICK[0]) / "fake.log").read_text()
    assert f"set_part {{{part}}}" in tcl and "create_clock -period 3.333" in tcl and "csynth_design" in tcl
    if expect_status != "pass":
        assert expect_status in out and "latency_max" in out
    md = (tmp_path / "r.md").read_text()
    assert "## Synthesis" in md and "latency_max" in md


def test_update_baselines_records_measurements(tmp_path):
    bindir = _fake_vitis(tmp_path)
    bdir = tmp_path / "b"
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "VITIS_HLS": ""}
    code, out = _invoke(["--kernel", PICK[0], "--csynth", "--update-baselines", "--device", "none", "--part", "xcu280-fsvh2892-2L-e",
                         "--baselines-dir", str(bdir), "--workdir", str(tmp_path / "w")], env=env)
    assert code == 0, out
    data = R.read_baselines("xcu280-fsvh2892-2L-e", bdir)
    assert data["entries"][PICK[0]] == parse_xml(FIX).metrics() and data["tool"] == "vitis_hls 2020.2"
    code, out = _invoke(["--kernel", PICK[0], "--update-baselines"])
    assert code != 0 and "--update-baselines needs --csynth" in out


@pytest.mark.parametrize("corrupt", [False, True], ids=["match", "corrupted"])
def test_cosim_runs_the_generated_testbench(tmp_path, corrupt):
    bindir = _fake_vitis(tmp_path, cosim_corrupt=corrupt)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "VITIS_HLS": ""}
    code, out = _invoke(["--kernel", PICK[1], "--cosim", "--device", "none", "--workdir", str(tmp_path / "w"),
                         "--report", str(tmp_path / "r")], env=env)
    c = json.loads((tmp_path / "r.json").read_text())["results"][0]["checks"]["cosim"]
    if corrupt:
        assert code == 1 and c["status"] == "fail" and "1 of" in c["detail"] and PICK[1] in out
    else:
        assert code == 0, out
        assert c["status"] == "pass" and c["data"]["mismatches"] == {"out": 0}
