"""offload build's persistent tops: which platforms keep the ring in host memory (and the source
that says so), the connectivity and Makefile of a project with <top>_ring kernels, their golden
C-simulation through the ring, and the CLI's --launch."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from _host_util import sa
from click.testing import CliRunner

from offload.cli import main
from offload.hls import build as hb
from offload.hls import persistent
from offload.hls.cards import CARDS, HOST_MEMORY_BLOCKLIST, ring_memory
from offload.hls.registry import get_hls_kind, register_hls_kind
from offload.host.bundle import Bundle, save
from offload.kernels.registry import get_kind, register_kind
from offload.sim.errors import UnsupportedError

NO_RING = "test_scale_add_no_ring"  # the test kind without a ring capacity


def _register_no_ring() -> None:
    try:
        get_kind(NO_RING)
        return
    except KeyError:
        pass
    register_kind(replace(get_kind(sa.KIND), name=NO_RING, spec_from_json=lambda d: sa.ScaleAddSpec(int(d["n"]), int(d["scale"]), kind=NO_RING)))
    register_hls_kind(replace(get_hls_kind(sa.KIND), name=NO_RING))


def _kernels():
    from offload.kernels.catalogue import entries

    emb = entries("emb/sum/ap_fixed16_6/d16/bag20/t1")[0].build().kernel
    mlp = next(e for e in entries() if e.kind == "mlp").build().kernel
    return {"emb": emb, "mlp": mlp}


# -- which platforms reach host memory -------------------------------------------------------------
@pytest.mark.parametrize("card", sorted(CARDS))
def test_default_platforms_keep_the_ring_in_host_memory(card):
    """No default platform matches the host_memory_simple_xrt blocklist (U50: only its gen3x4
    shell and the U50LV are listed), so every card's ring goes to HOST[0]."""
    rm = ring_memory(card)
    assert rm.host and rm.bank == "HOST[0]" and rm.platform == CARDS[card].platform
    assert "host_memory_simple_xrt" in rm.why


@pytest.mark.parametrize("platform, hit", [("xilinx_u50_gen3x4_xdma_2_202010_1", "u50_gen3x4"), ("xilinx_u50lv_gen3x4_xdma_2_202010_1", "u50lv")])
def test_blocklisted_platforms_fall_back_to_card_memory(platform, hit):
    rm = ring_memory("u50", platform)
    assert not rm.host and rm.bank is None
    assert repr(hit) in rm.why and "card memory" in rm.why
    assert hit in HOST_MEMORY_BLOCKLIST


# -- the project ----------------------------------------------------------------------------------
def _sp(cfg: str) -> dict[str, str]:
    return dict(ln[3:].split(":", 1) for ln in cfg.splitlines() if ln.startswith("sp="))


def test_both_launch_modes_in_one_project(tmp_path):
    ks = _kernels()
    proj = hb.write_project(Bundle("m", ks), "u55c", tmp_path / "prj", compute_units=2, launch="both")
    tops = {pk.top: pk for pk in proj.kernels}
    for k in ks.values():
        top, rt = get_hls_kind(k.kind).top_name(k.spec), persistent.top_name(k.spec)
        assert tops[top].launch == "per_call" and tops[rt].launch == "persistent"
        assert tops[rt].compute_units == [f"{rt}_1", f"{rt}_2"]
        assert (tmp_path / "prj" / "src" / rt / f"{rt}.cpp").is_file()
        assert tops[rt].ring["memory"] == "host" and tops[rt].ring["slots"] == persistent.DEFAULT_SLOTS
        assert tops[rt].ring["bytes"] == persistent.ring_layout(k.spec).nbytes
    sp = _sp((tmp_path / "prj" / "connectivity.cfg").read_text())
    emb = ks["emb"]
    top, rt = get_hls_kind("embedding").top_name(emb.spec), persistent.top_name(emb.spec)
    for i in (1, 2):
        assert sp[f"{rt}_{i}.ring"] == "HOST[0]"
        # The loop reads the tables the per-call CU reads: one copy on the card.
        assert sp[f"{rt}_{i}.table0"] == sp[f"{top}_{i}.table0"]
    # The ring top is compiled and linked as any other kernel: no flag of its own.
    make = (tmp_path / "prj" / "Makefile").read_text()
    assert f"-k {rt} -I include -I src/{rt} -o $@" in make and rt in make.split("KERNELS := ")[1].splitlines()[0]
    readme = (tmp_path / "prj" / "README.md").read_text()
    assert "## Persistent tops" in readme and "xrt-smi configure --host-mem" in readme
    pj = json.loads((tmp_path / "prj" / "project.json").read_text())
    assert {k["top"]: k["launch"] for k in pj["kernels"]}[rt] == "persistent"


def test_a_platform_without_host_memory_puts_the_ring_in_card_memory(tmp_path):
    ks = _kernels()
    proj = hb.write_project(Bundle("m", ks), "u50", tmp_path / "prj", platform="xilinx_u50_gen3x4_xdma_2_202010_1", launch="both")
    sp = _sp((tmp_path / "prj" / "connectivity.cfg").read_text())
    rings = {k: v for k, v in sp.items() if k.endswith(".ring")}
    assert rings and all(v.startswith("HBM[") for v in rings.values())
    assert all(pk.ring["memory"] == "card" and "u50_gen3x4" in pk.ring["why"] for pk in proj.kernels if pk.launch == "persistent")
    assert "xrt-smi" not in (tmp_path / "prj" / "README.md").read_text()


def test_per_call_only_and_persistent_only(tmp_path):
    k = sa.make_kernel("a", n=8, scale=3)
    top, rt = get_hls_kind(k.kind).top_name(k.spec), persistent.top_name(k.spec)
    per = hb.write_project(Bundle("m", {"a": k}), "u55c", tmp_path / "p1")
    assert [pk.top for pk in per.kernels] == [top]
    ring = hb.write_project(Bundle("m", {"a": k}), "u55c", tmp_path / "p2", launch="persistent")
    assert [pk.top for pk in ring.kernels] == [rt]
    cfg = (tmp_path / "p2" / "connectivity.cfg").read_text()
    assert f"sp={rt}_1.ring:HOST[0]" in cfg and f"{top}_1" not in cfg


def test_a_kind_without_a_ring_capacity(tmp_path):
    _register_no_ring()
    k = replace(sa.make_kernel("a", n=8, scale=3), spec=sa.ScaleAddSpec(8, 3, kind=NO_RING))
    both = hb.write_project(Bundle("m", {"a": k}), "u55c", tmp_path / "p1", launch="both")
    assert [pk.launch for pk in both.kernels] == ["per_call"]
    assert "no ring capacity" in both.notes[0] and "no ring capacity" in (tmp_path / "p1" / "README.md").read_text()
    with pytest.raises(UnsupportedError, match=r"'a': the test_scale_add_no_ring kind has no ring capacity"):
        hb.write_project(Bundle("m", {"a": k}), "u55c", tmp_path / "p2", launch="persistent")


# -- golden C-simulation through the ring -----------------------------------------------------------
def test_golden_check_simulates_the_persistent_tops():
    ks = {"sa": sa.make_kernel(n=8, scale=3), **_kernels()}
    res = hb.golden_check(Bundle("m", ks), cases=3, launch="both")
    tops = [r.top for r in res]
    for k in ks.values():
        assert get_hls_kind(k.kind).top_name(k.spec) in tops and persistent.top_name(k.spec) in tops
    assert all(r.mismatches == 0 and r.compared > 0 for r in res), res


def test_golden_check_catches_a_wrong_persistent_answer(monkeypatch):
    real = persistent.run_csim

    def off_by_one(kernel, requests, **kw):
        outs = real(kernel, requests, **kw)
        outs[-1] = {name: np.asarray(v) + 1 for name, v in outs[-1].items()}
        return outs

    monkeypatch.setattr(persistent, "run_csim", off_by_one)
    res = hb.golden_check(Bundle("m", {"sa": sa.make_kernel(n=8, scale=3)}), cases=3, launch="both")
    per_call, ring = res
    assert per_call.mismatches == 0
    assert ring.top.endswith("_ring") and ring.mismatches > 0 and ring.first.startswith("case 2:")


# -- the CLI ----------------------------------------------------------------------------------------
def test_cli_build_writes_the_persistent_tops_unless_told(tmp_path):
    p = save([sa.make_kernel("a", n=8, scale=3)], tmp_path / "m.offload", meta={"model": "t"})
    rt = persistent.top_name(sa.make_kernel("a", n=8, scale=3).spec)
    r = CliRunner().invoke(main, ["build", str(p), "--target", "u55c", "--out", str(tmp_path / "both")])
    assert r.exit_code == 0, r.output
    assert f"persistent top {rt}: ring in host memory" in r.output and rt in r.output  # C-simulated too
    assert f"sp={rt}_1.ring:HOST[0]" in (tmp_path / "both" / "connectivity.cfg").read_text()
    r = CliRunner().invoke(main, ["build", str(p), "--target", "u55c", "--out", str(tmp_path / "per"), "--launch", "per_call"])
    assert r.exit_code == 0, r.output
    assert rt not in (tmp_path / "per" / "connectivity.cfg").read_text()


def test_the_ring_a_bundle_records_is_the_one_compiled(tmp_path):
    """`offload build` compiles each persistent top for the ring its bundle records (else the defaults)."""
    k = sa.make_kernel("a", n=8, scale=3)
    rt = persistent.top_name(k.spec)
    sized = hb.write_project(Bundle("m", {"a": k}), "u55c", tmp_path / "p1", launch="persistent", ring_sizes={"a": (4, 2)})
    assert (sized.kernels[0].ring["slots"], sized.kernels[0].ring["rows"]) == (4, 2)
    plain = hb.write_project(Bundle("m", {"a": k}), "u55c", tmp_path / "p2", launch="persistent")
    assert (plain.kernels[0].ring["slots"], plain.kernels[0].ring["rows"]) == (persistent.DEFAULT_SLOTS, persistent.DEFAULT_ROWS)
    b = save([k], tmp_path / "b", rings={"a": {"slots": 4, "rows": 2}})
    r = CliRunner().invoke(main, ["build", str(b), "--target", "u55c", "--out", str(tmp_path / "p3"), "--launch", "persistent"])
    assert r.exit_code == 0, r.output
    built = json.loads((tmp_path / "p3" / "project.json").read_text())
    assert rt in json.dumps(built) and '"slots": 4' in json.dumps(built)
