"""offload.plan.cut on hand-written plans (no planner, no torch): a padding row in the row shard
that holds it and in no other, a Cartesian merge's product table and its shape, the part checks a
merge needs, and card_kernels' keyword surface. Each test fails on a cosmic-ray mutant that the
collection's end-to-end tests (test_sharded.py, whose TorchRec tables have no padding row) let
through (TESTING.md, "Mutation testing")."""

from __future__ import annotations

import numpy as np
import pytest

from offload.kernels import get_kind
from offload.kernels.embedding import TableSpec, combine_partials, make_kernel, make_spec
from offload.plan import Plan, Shard, TablePlan, Topology
from offload.plan.cut import assign, card_kernel, card_kernels, lookups
from offload.sim.errors import InputError, UnsupportedError

KIND = get_kind("embedding")
FMT = "ap_fixed<16,6>"
TOPO = Topology(hosts=[["u250", "u250"], ["u250"]], onchip_share=0.0)
CARDS = [(0, 0), (0, 1), (1, 0)]


def _shards(cuts, dim):
    """Row shards [cuts[i], cuts[i+1]) on the cards in turn, all columns."""
    return tuple(Shard(*CARDS[i % len(CARDS)], "DDR", 0, r0, r1, 0, dim, 0, 0.0, 0.0) for i, (r0, r1) in enumerate(zip(cuts, cuts[1:])))


def _plan(*tables: TablePlan) -> Plan:
    return Plan(TOPO, 8, tables)


def _route(inputs, r0, r1):
    """A bag's entries that fall in rows [r0, r1), renumbered from 0 (what a row shard is sent)."""
    idx, off = inputs["indices"].astype(np.int64), inputs["offsets"].astype(np.int64)
    keep = (idx >= r0) & (idx < r1)
    cum = np.concatenate(([0], np.cumsum(keep)))
    return {"indices": idx[keep] - r0, "offsets": cum[off]}


@pytest.mark.parametrize("pad, cuts, want", [
    (9, [0, 9, 14, 20], [None, 0, None]),    # the padding row opens a shard: the shard before ends there
    (11, [0, 9, 14, 20], [None, 2, None]),   # inside a shard
    (13, [0, 9, 14, 20], [None, 4, None]),   # the shard's last row
    (0, [0, 9, 14, 20], [0, None, None]),
])
def test_the_padding_row_moves_into_the_shard_that_holds_it(pad, cuts, want):
    rows, dim = 20, 3
    rng = np.random.default_rng(pad)
    spec = make_spec([TableSpec("p", rows, dim, FMT, padding_idx=pad)], mode="mean", max_bag_size=16)
    kernel = make_kernel("k", spec, [rng.uniform(-4, 4, (rows, dim))])
    plan = _plan(TablePlan("p", rows, dim, FMT, "row_wise", 4.0, ("f",), _shards(cuts, dim)))
    groups = [lookups(kernel, plan)]
    by_card = assign(groups, plan)
    slots = [sl for card in CARDS for g, sls in by_card[card] for sl in sls]
    ks = [card_kernel(card, g, spec, groups[g], sls) for card in CARDS for g, sls in by_card[card]]
    assert [(sl.r0, sl.r1) for sl in slots] == list(zip(cuts, cuts[1:]))
    assert [k.spec.tables[0].padding_idx for k in ks] == want
    assert [k.spec.tables[0].num_rows for k in ks] == [b - a for a, b in zip(cuts, cuts[1:])]
    # Bags hitting the padding row often: the combined mean counts only the other entries.
    B = 40
    lens = rng.integers(0, 6, size=B)
    idx = np.where(rng.random(int(lens.sum())) < 0.3, pad, rng.integers(0, rows, size=int(lens.sum())))
    inputs = {"indices": idx.astype(np.int64), "offsets": np.concatenate(([0], np.cumsum(lens))).astype(np.int64)}
    want_out = KIND.reference(spec, kernel.tensors, inputs)["out"]
    accs, counts = [], []
    for k, sl in zip(ks, slots):
        got = KIND.reference(k.spec, k.tensors, _route(inputs, sl.r0, sl.r1))
        accs.append(got["out"])
        counts.append(got["count"][:, 0])
    assert (combine_partials(spec, accs, counts) == want_out).all()


def _merge_case(ftm=None, rowwise_b=False):
    ra, da, rb, db = 7, 2, 5, 3
    rng = np.random.default_rng(1)
    wa, wb = rng.uniform(-4, 4, (ra, da)), rng.uniform(-4, 4, (rb, db))
    tb = TableSpec("b", rb, db, FMT)
    spec = make_spec([TableSpec("a", ra, da, FMT), tb], mode="sum", max_bag_size=4, feature_table_map=ftm)
    kernel = make_kernel("k", spec, [wa, wb])
    shards = (Shard(0, 0, "DDR", 0, 0, 20, 0, da + db, 0, 0.0, 0.0), Shard(0, 1, "DDR", 0, 20, ra * rb, 0, da + db, 0, 0.0, 0.0))
    plan = _plan(TablePlan("a*b", ra * rb, da + db, FMT, "row_wise", 1.0, ("fa", "fb"), shards, ("a", "b"), (ra, rb), (da, db)))
    return kernel, plan


def test_a_merge_is_one_product_table_of_the_parts_shape():
    kernel, plan = _merge_case()
    (lk,) = lookups(kernel, plan)
    A, Bt = kernel.tensors["table0"], kernel.tensors["table1"]
    assert lk.features == (0, 1) and lk.plan_name == "a*b"
    assert (lk.table.num_rows, lk.table.dim) == (35, 5) and type(lk.table.num_rows) is int
    assert lk.part_rows == (7, 5) and lk.part_dims == (2, 3)
    prod = lk.tensors["table"]
    assert prod.shape == (35, 5)
    for i in range(7):
        for j in range(5):
            assert (prod[i * 5 + j] == np.concatenate([A[i], Bt[j]])).all()


def test_card_kernels_takes_keywords_and_is_unweighted_by_default():
    kernel, plan = _merge_case()
    got = card_kernels(kernels=[kernel], plan=plan)  # the merge is refused only for a weighted collection
    assert sorted(got) == [(0, 0), (0, 1)]
    (k0, s0), = got[(0, 0)]
    (k1, s1), = got[(0, 1)]
    assert [(s.r0, s.r1) for s in s0 + s1] == [(0, 20), (20, 35)]
    assert (k0.tensors["table0"].shape, k1.tensors["table0"].shape) == ((20, 5), (15, 5))
    with pytest.raises(UnsupportedError, match="weighted"):
        card_kernels([kernel], plan, weighted=True)


def test_a_merge_whose_part_is_looked_up_twice_is_refused():
    # Features a, b, b (b's table shared by two features): the names match the parts, the count does not.
    kernel, plan = _merge_case(ftm=(0, 1, 1))
    with pytest.raises(InputError, match="needs features of"):
        lookups(kernel, plan)


def test_a_table_planned_at_another_shape_is_refused():
    spec = make_spec([TableSpec("t", 10, 4, FMT)], mode="sum", max_bag_size=4)
    kernel = make_kernel("k", spec, [np.zeros((10, 4))])
    for rows, dim in [(11, 4), (10, 3)]:
        plan = _plan(TablePlan("t", rows, dim, FMT, "table_wise", 1.0, ("f",), _shards([0, rows], dim)))
        with pytest.raises(InputError, match="planned"):
            lookups(kernel, plan)


@pytest.mark.parametrize("parts, rows, dim, match", [
    (("a", "b", "c"), 70, 7, "3 parts"),   # a third part's feature would never be looked up
    (("a", "b"), 36, 5, "planned 36 x 5, its parts' product is 35 x 5"),
    (("a", "b"), 35, 4, "planned 35 x 4"),
])
def test_a_merge_planned_other_than_the_two_parts_product_is_refused(parts, rows, dim, match):
    spec = make_spec([TableSpec("a", 7, 2, FMT), TableSpec("b", 5, 3, FMT), TableSpec("c", 2, 2, FMT)], mode="sum", max_bag_size=4)
    kernel = make_kernel("k", spec, [np.ones((7, 2)), np.ones((5, 3)), np.ones((2, 2))])
    shards = (Shard(0, 0, "DDR", 0, 0, rows, 0, dim, 0, 0.0, 0.0),)
    merged = TablePlan("m", rows, dim, FMT, "table_wise", 1.0, (), shards, parts, (7, 5, 2)[:len(parts)], (2, 3, 2)[:len(parts)])
    rest = () if "c" in parts else (TablePlan("c", 2, 2, FMT, "table_wise", 1.0, (), _shards([0, 2], 2)),)
    with pytest.raises((InputError, UnsupportedError), match=match):
        lookups(kernel, _plan(merged, *rest))


@pytest.mark.parametrize("a, b, match", [
    (TableSpec("a", 7, 2, FMT), TableSpec("b", 5, 3, "ap_fixed<8,3>"), "one fixed-point format"),
    (TableSpec("a", 7, 2, FMT, padding_idx=0), TableSpec("b", 5, 3, FMT), "no padding row"),
    (TableSpec("a", 7, 2, FMT), TableSpec("b", 5, 3, FMT, padding_idx=4), "no padding row"),
])
def test_merge_parts_of_two_formats_or_with_a_padding_row_are_refused(a, b, match):
    spec = make_spec([a, b], mode="sum", max_bag_size=4)
    kernel = make_kernel("k", spec, [np.zeros((7, 2)), np.zeros((5, 3))])
    _, plan = _merge_case()
    with pytest.raises(UnsupportedError, match=match):
        lookups(kernel, plan)


def test_a_merge_whose_two_features_both_read_one_part_is_refused():
    # Features a, a: as many features as parts, but part b is never looked up.
    kernel, plan = _merge_case(ftm=(0, 0))
    with pytest.raises(InputError, match=r"needs features of \['a', 'b'\] in one pooling group, got \['a'\]"):
        lookups(kernel, plan)


def test_card_kernels_are_named_for_their_host_card_and_group():
    spec = make_spec([TableSpec("t", 30, 2, FMT)], mode="sum", max_bag_size=4)
    kernel = make_kernel("k", spec, [np.zeros((30, 2))])
    plan = _plan(TablePlan("t", 30, 2, FMT, "row_wise", 1.0, ("f",), _shards([0, 10, 20, 30], 2)))
    names = {card: [k.name for k, _ in ks] for card, ks in card_kernels([kernel, kernel], plan).items()}
    assert names == {(h, c): [f"shard_h{h}c{c}_g0", f"shard_h{h}c{c}_g1"] for h, c in CARDS}
