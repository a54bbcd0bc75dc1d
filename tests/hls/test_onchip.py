"""Tables held on chip: the generated kernel compiles their contents in as BRAM/URAM ROMs (no
m_axi port), computes bit for bit what the simulator computes from the tensors, names itself by
those contents, and refuses a card without the blocks for them."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import offload
from offload.hls import csim
from offload.hls.cards import get_card
from offload.hls.embedding import OnChipBudgetError, check_onchip, onchip_blocks
from offload.hls.registry import get_hls_kind
from offload.kernels import get_kind
from offload.kernels.embedding import ROWWISE, OnChip, TableSpec, hold_on_chip, make_kernel, make_spec
from offload.sim.errors import InputError, OffloadError

from _embedding_harness import make_case, random_tables, run_cpp

HK = get_hls_kind("embedding")
KIND = get_kind("embedding")
FX = "ap_fixed<16,6,AP_RND_CONV,AP_SAT>"


def _kernel(mode: str, seed: int = 0):
    # One table behind a port (HBM), a row-wise one in BRAM and a fixed-point one in URAM.
    spec = make_spec([TableSpec("hbm", 11, 3, FX, padding_idx=4),
                      TableSpec("rw", 9, 4, ROWWISE, "ap_fixed<22,4,AP_RND_CONV,AP_SAT>", padding_idx=8),
                      TableSpec("ux", 6, 2, "ap_ufixed<10,3>")], mode=mode, max_bag_size=8)
    rng = np.random.default_rng(seed)
    tables = random_tables(rng, spec)
    tables[2] = np.abs(tables[2])
    return hold_on_chip(make_kernel("k", spec, tables), {"rw": "bram", "ux": "uram"}), rng


def _top(spec) -> str:
    return HK.sources(spec)[f"{HK.top_name(spec)}.cpp"]


@pytest.mark.skipif(not csim.ap_types_include().is_dir(), reason="ap_types headers missing")
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_on_chip_and_hbm_tables_c_simulate_bit_for_bit(mode):
    k, rng = _kernel(mode, seed={"sum": 1, "mean": 2, "max": 3}[mode])
    assert [a.name for a in HK.top_args(k.spec) if a.role == "resident"] == ["table0"]
    for B, max_len in [(10, 8), (1, 8), (3, 0)]:
        for weighted in ([False, True] if mode == "sum" else [False]):
            inputs = make_case(rng, k.spec, B, max_len, weighted=weighted, pad_frac=0.2)
            KIND.validate(k.spec, k.tensors, inputs)
            want = KIND.reference(k.spec, k.tensors, inputs)["out"]
            # The kernel gets only table0's buffer: the other two tables are its own constants.
            got = run_cpp(k.spec, {"table0": k.tensors["table0"]}, inputs)["out"]
            assert got.shape == want.shape
            assert int((got != want).sum()) == 0, (B, weighted)


def test_source_holds_the_contents_with_the_binding_pragma_and_no_port():
    k, _ = _kernel("sum")
    top = _top(k.spec)
    assert re.search(r"m_axi port = table0 ", top)
    for name in ("table1", "params1", "table2"):
        assert not re.search(rf"port = {name}\b", top), name
        assert f"{name}:" not in top
    assert "#pragma HLS bind_storage variable=table1 type=rom_2p impl=bram" in top
    assert "#pragma HLS bind_storage variable=params1 type=rom_2p impl=bram" in top
    assert "#pragma HLS bind_storage variable=table2 type=rom_2p impl=uram" in top
    assert "params2" not in top  # a fixed-point table has no per-row params
    # The arrays hold the tensors' raw values, row-major, in their storage containers.
    for name, ctype in (("table1", "uint8_t"), ("params1", "int32_t"), ("table2", "uint16_t")):
        m = re.search(rf"static const {ctype} {name}\[(\d+)\] = \{{(.*?)\}};", top, re.S)
        assert m, name
        vals = [int(v) for v in m.group(2).replace("\n", " ").split(",") if v.strip()]
        assert int(m.group(1)) == len(vals) and vals == k.tensors[name].ravel().tolist(), name
    # The placement gives banks to the ports there are and to nothing else.
    ports = HK.placement(k.spec, "u55c", 1, None).banks[f"{HK.top_name(k.spec)}_1"]
    assert set(ports) == {"table0", "indices", "offsets", "per_sample_weights", "out"}


def test_the_kernel_name_depends_on_the_contents_and_off_chip_kernels_are_unchanged():
    k, _ = _kernel("sum")
    base = k.spec
    t1 = base.tables[1]
    bumped = list(t1.onchip.table)
    bumped[5] = (bumped[5] + 1) % 256
    changed = replace(base, tables=(base.tables[0], replace(t1, onchip=replace(t1.onchip, table=tuple(bumped))), base.tables[2]))
    assert HK.top_name(changed) != HK.top_name(base)
    assert HK.top_name(replace(base, tables=(base.tables[0], replace(t1, onchip=replace(t1.onchip, memory="uram")), base.tables[2]))) != HK.top_name(base)
    # Without on-chip tables the spec (so its JSON, name and sources) is the plain kernel's.
    plain = replace(base, tables=tuple(replace(t, onchip=None) for t in base.tables))
    fresh = make_spec([replace(t, onchip=None) for t in base.tables], mode="sum", max_bag_size=8)
    assert plain.to_json() == fresh.to_json() and "onchip" not in str(fresh.to_json())
    assert HK.sources(plain) == HK.sources(fresh) and "bind_storage" not in _top(fresh)
    # The config header's spec comment counts the contents rather than repeating them.
    cfg = HK.sources(base)["offload_embedding_cfg.h"]
    assert '"table": "<36 values>"' in cfg and '"params": "<18 values>"' in cfg


def test_a_card_without_the_blocks_refuses_the_table_naming_its_bytes_and_the_limit():
    k, _ = _kernel("sum")
    # 9 x 4 uint8 codes fit one BRAM36 (4K x 9); 18 int32 params one more (1K x 36); 12 uint16 in URAM one 4K x 72.
    assert [onchip_blocks(t) for t in k.spec.tables[1:]] == [2, 1]
    assert onchip_blocks(k.spec.tables[0], "bram") == 1
    # 10,000 8-bit words: 3 BRAM36 as 4K x 9, 3 URAM as 4K x 72 (one lane used).
    big = TableSpec("big", 100, 100, "ap_fixed<8,3>")
    assert (onchip_blocks(big, "bram"), onchip_blocks(big, "uram")) == (3, 3)
    assert check_onchip(k.spec, "u280") == {"bram": 2, "uram": 1}
    tiny = replace(get_card("u280"), name="tiny", bram36=1)
    with pytest.raises(OnChipBudgetError) as e:
        check_onchip(k.spec, tiny)
    msg = str(e.value)
    assert "'rw'" in msg and f"{k.spec.tables[1].bytes()} bytes" in msg and "1 BRAM36 blocks (4608 bytes)" in msg
    assert isinstance(e.value, InputError) and isinstance(e.value, ValueError) and isinstance(e.value, OffloadError)
    with pytest.raises(OnChipBudgetError, match="'ux'.*0 URAM blocks"):
        HK.placement(k.spec, replace(get_card("u280"), name="nouram", uram=0), 1, None)
    # What other kernels on the card already take counts too.
    with pytest.raises(OnChipBudgetError, match="'rw'.*after the 2015 other tables take"):
        check_onchip(k.spec, "u280", {"bram": 2015})


def test_the_contents_must_be_the_tensors_and_fit_the_table():
    k, _ = _kernel("sum")
    bad = dict(k.tensors)
    bad["params1"] = bad["params1"].copy()
    bad["params1"][0, 1] += 1
    with pytest.raises(ValueError, match="params1.*on-chip contents"):
        KIND.check_tensors(k.spec, bad)
    with pytest.raises(InputError, match="'rw'.*36 codes and 18 params.*8 x 4"):
        replace(k.spec.tables[1], num_rows=8)
    with pytest.raises(InputError, match="onchip.memory"):
        OnChip("lutram", (1,))
    with pytest.raises(InputError, match=r"no table named \['nope'\]"):
        hold_on_chip(k, {"nope": "bram"})


def test_a_bundle_keeps_its_on_chip_tables(tmp_path):
    k, _ = _kernel("mean")
    b = offload.load(offload.save(k, tmp_path / "m.offload"))
    (got,) = b.kernels.values()
    assert got.spec == k.spec and HK.top_name(got.spec) == HK.top_name(k.spec)
    assert got.spec.tables[2].onchip == k.spec.tables[2].onchip


@pytest.mark.skipif(not csim.ap_types_include().is_dir(), reason="ap_types headers missing")
def test_the_emu_device_runs_an_on_chip_kernel_as_the_simulator_does():
    from offload.host import open_device

    k, rng = _kernel("mean", seed=4)
    dev = open_device("emu")
    try:
        h = dev.load(k)
        for B in (7, 1):
            inputs = make_case(rng, k.spec, B, 8, pad_frac=0.2)
            want = KIND.reference(k.spec, k.tensors, inputs)["out"]
            assert np.array_equal(np.asarray(dev.run(h, inputs)["out"]), want)
    finally:
        dev.close()
