"""ShardedEmbeddingBagCollection on a small hand-written plan: FBGEMM's non-fatal bounds-check
modes (out-of-range indices become row 0, as on one device) and the position and value each
refusal names. Each test fails on a cosmic-ray mutant that test_sharded.py lets through
(TESTING.md, "Mutation testing")."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("torchrec")

from torchrec import KeyedJaggedTensor  # noqa: E402

from offload.kernels.embedding import TableSpec, make_kernel, make_spec  # noqa: E402
from offload.nn import EmbeddingBagCollection, ShardedEmbeddingBagCollection, TableBatchedEmbeddingBags  # noqa: E402
from offload.plan import Plan, Shard, TablePlan, Topology  # noqa: E402
from offload.sim.errors import IndexRangeError, InputError  # noqa: E402

FMT = "ap_fixed<16,6>"
SHAPES = {"big": (30, 4), "c": (6, 2), "d": (4, 3)}
KEYS = ["fbig", "fc", "fd"]


def _single(bounds: str = "fatal") -> EmbeddingBagCollection:
    rng = np.random.default_rng(0)
    tables = [TableSpec(n, r, d, FMT) for n, (r, d) in SHAPES.items()]
    kernel = make_kernel("k", make_spec(tables, mode="sum", max_bag_size=8), [rng.uniform(-4, 4, s) for s in SHAPES.values()])
    return EmbeddingBagCollection([(TableBatchedEmbeddingBags(kernel, bounds_check=bounds), KEYS)], KEYS)


def _plan() -> Plan:
    """'big' row-wise over two cards of host 0; one-hot 'c' x 'd' merged into one table on host 1."""
    def shard(h, c, r0, r1, dim):
        return Shard(h, c, "DDR", 0, r0, r1, 0, dim, 0, 0.0, 0.0)

    big = TablePlan("big", 30, 4, FMT, "row_wise", 2.0, ("fbig",), (shard(0, 0, 0, 10, 4), shard(0, 1, 10, 30, 4)))
    cd = TablePlan("c*d", 24, 5, FMT, "table_wise", 1.0, ("fc", "fd"), (shard(1, 0, 0, 24, 5),), ("c", "d"), (6, 4), (2, 3))
    return Plan(Topology(hosts=[["u250", "u250"], ["u250"]], onchip_share=0.0), 4, (big, cd))


def _kjt(big, c, d, big_lens=(2, 1, 0, 2), c_lens=(1, 1, 1, 1), d_lens=(1, 1, 1, 1)) -> KeyedJaggedTensor:
    vals = torch.tensor(list(big) + list(c) + list(d), dtype=torch.int64)
    lens = torch.tensor(list(big_lens) + list(c_lens) + list(d_lens), dtype=torch.int64)
    return KeyedJaggedTensor.from_lengths_sync(keys=KEYS, values=vals, lengths=lens)


@pytest.fixture
def pair(request):
    bounds = getattr(request, "param", "fatal")
    single, sharded = _single(bounds), None
    try:
        sharded = ShardedEmbeddingBagCollection(single, _plan())
        yield single, sharded
    finally:
        if sharded is not None:
            sharded.close()


def _same(single, sharded, kjt):
    want, got = single(kjt).values().numpy(), sharded(kjt).values().numpy()
    assert want.shape == got.shape == (4, 9)
    assert (want.view(np.int32) == got.view(np.int32)).all()


def test_in_range_bags_match_one_device(pair):
    single, sharded = pair
    _same(single, sharded, _kjt([3, 12, 29, 0, 10], [0, 5, 2, 1], [3, 0, 1, 2]))


@pytest.mark.parametrize("pair", ["warning", "ignore"], indirect=True)
def test_non_fatal_bounds_checks_read_row_0_as_one_device_does(pair):
    single, sharded = pair
    kjt = _kjt([3, 30, 29, -2, 10], [0, 6, 2, 1], [3, 0, 1, 9])  # 30, -2, 6 and 9 out of range
    outs = []
    for m in (single, sharded):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            outs.append(m(kjt).values().numpy())
        said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
        assert said == (["bounds check: 4 index(es) outside their table set to 0"] if single.tbes[0].bounds_check == "warning" else [])
    want, got = outs
    assert want.shape == got.shape == (4, 9)
    assert (want.view(np.int32) == got.view(np.int32)).all()


@pytest.mark.parametrize("c, bad", [([0, 6, 2, 1], 1), ([2, -1, 0, 1], 1), ([1, 2, 0, 7], 3)])
def test_an_out_of_range_index_is_named_at_its_place_in_the_group(pair, c, bad):
    # Feature 'fc' comes after 'fbig' (5 values) in the group, and a 0 precedes or follows the bad entry.
    single, sharded = pair
    big = [3, 12, 29, 0, 10]
    pos = len(big) + bad
    with pytest.raises(IndexRangeError) as e:
        sharded(_kjt(big, c, [3, 0, 1, 2]))
    assert re.fullmatch(rf"indices\[{pos}\] = {c[bad]} is out of range for feature 'fc' with 6 rows", str(e.value))
    with pytest.raises(IndexError, match=rf"indices\[{pos}\] = {c[bad]} "):  # one device names the same entry
        single(_kjt(big, c, [3, 0, 1, 2]))


@pytest.mark.parametrize("c_lens, d_lens, bad, held", [((1, 1, 1, 1), (1, 1, 2, 0), 2, (1, 2)),
                                                       ((1, 1, 0, 1), (1, 1, 1, 1), 2, (0, 1))])
def test_a_planned_one_hot_bag_holding_more_or_less_is_named(pair, c_lens, d_lens, bad, held):
    single, sharded = pair
    c = [0, 5, 2, 1][:sum(c_lens)]
    d = [3, 0, 1, 2][:sum(d_lens)]
    with pytest.raises(InputError) as e:
        sharded(_kjt([3, 12, 29, 0, 10], c, d, c_lens=c_lens, d_lens=d_lens))
    assert str(e.value) == (f"features 'fc', 'fd': planned one-hot (merged table 'c*d') but bag {bad} holds "
                            f"{held[0]} and {held[1]} entries")
