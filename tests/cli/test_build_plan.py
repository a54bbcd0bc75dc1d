"""``offload build BUNDLE --plan plan.json``: one project per card of the plan, each connectivity
file putting every shard in the bank the plan chose, and each card's kernel, compiled from the
project's own sources, returning what the plan's sim engine returns for that card."""

from __future__ import annotations

import ctypes
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import offload
import offload.plan as P
from offload.cli.build import build_cmd
from offload.hls import csim
from offload.hls.cards import get_card
from offload.hls.embedding import OnChipBudgetError
from offload.hls.registry import get_hls_kind
from offload.kernels.embedding import TableSpec, make_kernel, make_spec
from offload.plan.cut import card_kernels
from offload.plan.engine import open_engine
from offload.plan.project import card_dir, write_card_projects

pytestmark = pytest.mark.skipif(not csim.ap_types_include().is_dir(), reason="ap_types headers missing")

FMT = "ap_fixed<16,6,AP_RND_CONV,AP_SAT>"
SHAPES = {"big": (40, 4), "wide": (12, 6), "small": (9, 2)}


def _bundle(tmp: Path) -> Path:
    rng = np.random.default_rng(7)
    spec = make_spec([TableSpec(n, r, d, FMT) for n, (r, d) in SHAPES.items()], mode="sum", max_bag_size=8)
    k = make_kernel("ebc_sum", spec, [rng.uniform(-4, 4, (r, d)) for r, d in SHAPES.values()])
    return offload.save(k, tmp / "m.offload")


def _plan(tmp: Path, onchip: bool = False) -> P.Plan:
    # Two U280s (HBM and DDR): a row-wise table over both cards, a column-wise one, a pinned one.
    topo = P.Topology(hosts=[["u280", "u280"]], onchip_share=0.5 if onchip else 0.0)
    cons = {"big": {"sharding": "row_wise", "memory": "hbm"}, "wide": {"sharding": "column_wise", "memory": "ddr"},
            "small": {"card": (0, 1)} if not onchip else {"memory": "onchip"}}
    plan = P.shard([P.Table(n, r, d, FMT, pooling_factor=4.0) for n, (r, d) in SHAPES.items()], topo, cons, merge_budget=0)
    plan.to_json(tmp / "plan.json")
    return plan


def _run_project_top(root: Path, kernel, inputs):
    """The card kernel's top function compiled from the project's src/<top>/ files, called on ``inputs``."""
    hk = get_hls_kind("embedding")
    top = hk.top_name(kernel.spec)
    srcs = sorted((root / "src" / top).iterdir())
    lib = csim.load_library(csim.build(srcs, shared=True))
    fn = getattr(lib, top)
    args = list(hk.top_args(kernel.spec))
    fn.argtypes = [ctypes.c_int32 if a.role == "scalar" else ctypes.c_void_p for a in args]
    res, packed = hk.pack_resident(kernel.spec, kernel.tensors), hk.pack_inputs(kernel.spec, inputs)
    fn(*[int(packed[a.name]) if a.role == "scalar" else (res if a.role == "resident" else packed)[a.name].ctypes.data for a in args])
    return hk.unpack_outputs(kernel.spec, inputs, {k: v for k, v in packed.items() if isinstance(v, np.ndarray)})


def _inputs(spec, rng, B=6):
    lens = rng.integers(0, 5, spec.num_tables * B)
    idx = np.concatenate([rng.integers(0, t.num_rows, int(lens[i * B:(i + 1) * B].sum())) for i, t in enumerate(spec.tables)])
    return {"indices": idx.astype(np.int64), "offsets": np.concatenate(([0], np.cumsum(lens))).astype(np.int64)}


def test_one_project_per_card_with_the_plans_banks_and_the_engines_results(tmp_path):
    bpath, plan = _bundle(tmp_path), _plan(tmp_path)
    assert {plan.table("big").sharding, plan.table("wide").sharding} == {"row_wise", "column_wise"}
    out = tmp_path / "build"
    r = CliRunner().invoke(build_cmd, [str(bpath), "--plan", str(tmp_path / "plan.json"), "--out", str(out), "--cases", "2"])
    assert r.exit_code == 0, r.output
    assert r.output.count("0 mismatches") == len(plan.cards) == 2
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [f"h{h}c{c}" for h, c in plan.cards]
    kernels = card_kernels(list(offload.load(bpath).kernels.values()), plan)
    hk = get_hls_kind("embedding")
    rng = np.random.default_rng(3)
    for card, ks in kernels.items():
        root = card_dir(out, card)
        cfg = (root / "connectivity.cfg").read_text()
        for k, slots in ks:
            top = hk.top_name(k.spec)
            for i, sl in enumerate(slots):
                assert re.search(rf"^sp={top}_1\.table{i}:{sl.shard.kind}\[{sl.shard.bank}\]$", cfg, re.M), (card, i, cfg)
            inputs = _inputs(k.spec, rng)
            eng = open_engine("local", plan.topology, device="sim")
            eng.load({card: [k]})
            try:
                want = eng.run({card: [inputs]})[card][0]
            finally:
                eng.close()
            got = _run_project_top(root, k, inputs)
            assert set(got) == {"out", "count"}
            for name in ("out", "count"):
                assert np.array_equal(got[name], want[name]), (card, name)
    banks = {(s.where, s.kind, s.bank) for t in plan.tables for s in t.shards}
    named = {(card, m.group(1), int(m.group(2))) for card in kernels
             for m in re.finditer(r"\.table\d+:(HBM|DDR)\[(\d+)\]", (card_dir(out, card) / "connectivity.cfg").read_text())}
    assert named == banks


def test_an_on_chip_shard_is_built_into_its_cards_kernel(tmp_path):
    bpath, plan = _bundle(tmp_path), _plan(tmp_path, onchip=True)
    (small,) = plan.table("small").shards
    assert small.kind == "onchip"
    out = tmp_path / "build"
    r = CliRunner().invoke(build_cmd, [str(bpath), "--plan", str(tmp_path / "plan.json"), "--out", str(out), "--cases", "1"])
    assert r.exit_code == 0, r.output
    assert r.output.count("0 mismatches") == len(plan.cards) and "left out" not in r.output
    # The card's project, as the command wrote it: the kernel that holds the shard, its slot and contents.
    projects = write_card_projects(offload.load(bpath), plan, tmp_path / "again")
    cp = projects[small.where]
    (k,) = [k for k in cp.kernels.values() if any(t.name == "small@r0c0" for t in k.spec.tables)]
    i = [t.name for t in k.spec.tables].index("small@r0c0")
    assert k.spec.tables[i].onchip.memory == "bram"
    hk = get_hls_kind("embedding")
    top = hk.top_name(k.spec)
    root = card_dir(out, small.where)
    cpp = (root / "src" / top / f"{top}.cpp").read_text()
    assert f"#pragma HLS bind_storage variable=table{i} type=rom_2p impl=bram" in cpp
    assert not re.search(rf"port = table{i}\b", cpp)
    held = re.search(rf"static const int16_t table{i}\[(\d+)\] = \{{(.*?)\}};", cpp, re.S)
    want_rows = offload.load(bpath).kernels["ebc_sum"].tensors["table2"]  # "small", the bundle's third table
    assert [int(v) for v in held.group(2).split(",") if v.strip()] == want_rows.ravel().tolist()
    # Connectivity: every port of the top, and no line for the on-chip table; no note about it.
    cfg = (root / "connectivity.cfg").read_text()
    listed = set(re.findall(rf"^sp={top}_1\.(\w+):", cfg, re.M))
    assert listed == {a.name for a in hk.top_args(k.spec) if a.role != "scalar"} and f"table{i}" not in listed
    assert not json.loads((root / "project.json").read_text())["notes"]
    # The card kernel compiled from the project's own files returns what the sim engine does for that card.
    rng = np.random.default_rng(5)
    for _ in range(2):
        inputs = _inputs(k.spec, rng)
        eng = open_engine("local", plan.topology, device="sim")
        eng.load({small.where: [k]})
        try:
            want = eng.run({small.where: [inputs]})[small.where][0]
        finally:
            eng.close()
        got = _run_project_top(root, k, inputs)
        for name in ("out", "count"):
            assert np.array_equal(got[name], want[name]), name


def test_on_chip_shards_past_the_cards_blocks_are_refused(tmp_path):
    # One BRAM36 and no URAM: the planner's bytes (4608 on chip) take both small tables, the blocks
    # only one (each is its own ROM), so the second goes to URAM, which the card lacks.
    card = replace(get_card("u280"), bram36=1, uram=0)
    topo = P.Topology(hosts=[[card]], onchip_share=1.0)
    cons = {"big": {"memory": "hbm"}, "wide": {"memory": "onchip"}, "small": {"memory": "onchip"}}
    plan = P.shard([P.Table(n, r, d, FMT, pooling_factor=4.0) for n, (r, d) in SHAPES.items()], topo, cons, merge_budget=0)
    assert sorted(t.name for t in plan.tables if t.shards[0].kind == "onchip") == ["small", "wide"]
    refused = r"'(small|wide)@r0c0': \d+ bytes on chip take 1 URAM blocks; card u280 has 0 URAM blocks \(0 bytes\)"
    with pytest.raises(OnChipBudgetError, match=refused):
        write_card_projects(offload.load(_bundle(tmp_path)), plan, tmp_path / "b")


def test_plan_and_bundle_must_agree_and_vitis_is_refused(tmp_path):
    bpath = _bundle(tmp_path)
    P.shard([P.Table("other", 10, 4, FMT)], P.Topology.uniform("u280")).to_json(tmp_path / "other.json")
    r = CliRunner().invoke(build_cmd, [str(bpath), "--plan", str(tmp_path / "other.json"), "--out", str(tmp_path / "b")])
    assert r.exit_code != 0 and "'big'" in r.output and "not in the plan" in r.output
    _plan(tmp_path)
    r = CliRunner().invoke(build_cmd, [str(bpath), "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "b"), "--vitis"])
    assert r.exit_code != 0 and "make hw" in r.output
    r = CliRunner().invoke(build_cmd, [str(bpath), "--out", str(tmp_path / "b")])
    assert r.exit_code != 0 and "--target is required" in r.output
    for extra in (["--target", "u55c"], ["--cus", "2"], ["--launch", "persistent"], ["--platform", "p"]):
        r = CliRunner().invoke(build_cmd, [str(bpath), "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "c"), *extra])
        assert r.exit_code == 2 and f"--plan: {extra[0]} cannot be used with it" in r.output, (extra, r.output)
        assert not (tmp_path / "c").exists()  # refused before anything is written
