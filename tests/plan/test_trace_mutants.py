"""offload.plan.trace's laws and checks, measured: Zipf draws follow (r+1)^-alpha over the whole
table (the exact law up to 2^22 rows, the Pareto tail past it), stack draws reuse rows at
Zipf-distributed LRU depths, a pooling of 0 is a table never looked up, the default seed is 0, and
malformed traces are refused. Tolerances are five binomial standard deviations of the seeded
sample. Each test fails on a cosmic-ray mutant that test_trace.py lets through (TESTING.md,
"Mutation testing")."""

from __future__ import annotations

import numpy as np
import pytest

from offload.plan import Table
from offload.plan.trace import IndexTrace, generate
from offload.sim.errors import InputError


def _within_5_sigma(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= 5 * np.sqrt(n * p * (1 - p))


@pytest.mark.parametrize("rows, alpha", [(7, 1.1), (40, 0.8)])
def test_zipf_draws_follow_the_law_over_every_row(rows, alpha):
    n = 20000
    x = generate([rows], batch=n, pooling=1, mode="zipf", alpha=alpha, seed=11).table(0)
    w = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    counts = np.bincount(x, minlength=rows)
    assert counts.shape == (rows,)
    bad = [r for r in range(rows) if not _within_5_sigma(int(counts[r]), n, w[r] / w.sum())]
    assert not bad, f"rows {bad}: counts {counts[bad].tolist()} for {[round(n * w[r] / w.sum()) for r in bad]}"


@pytest.mark.parametrize("rows", [1 << 22, (1 << 22) + 1])
def test_zipf_uses_the_exact_law_up_to_2_22_rows_then_the_pareto_tail(rows):
    n, alpha = 20000, 1.1
    x = generate([rows], batch=n, pooling=1, mode="zipf", alpha=alpha, seed=12).table(0)
    if rows <= 1 << 22:
        p0 = 1 / (np.arange(1, rows + 1, dtype=np.float64) ** -alpha).sum()
    else:
        p0 = 1 - 2.0 ** -alpha  # numpy's pareto is Lomax: P(X < 1) = 1 - 2^-alpha
    assert _within_5_sigma(int((x == 0).sum()), n, p0)
    assert x.max() < rows


def test_stack_draws_reuse_rows_at_zipf_lru_depths():
    # Rows so many that fresh draws hardly ever repeat: the repeats are the reuses. After the
    # stack has filled (4096 rows), a reuse's LRU depth d has P(d) = (d+1)^-alpha / H(4096).
    alpha = 1.1
    x = generate([10**7], batch=20000, pooling=1, mode="stack", alpha=alpha, reuse=0.6, seed=3).table(0).tolist()
    stack: list[int] = []
    depths = []
    for i, v in enumerate(x):
        if v in stack:
            d = len(stack) - 1 - stack.index(v)
            stack.remove(v)
            if i >= 12000:
                depths.append(d)
        stack.append(v)
    depths = np.array(depths)
    w = np.arange(1, 4097, dtype=np.float64) ** -alpha
    assert _within_5_sigma(int((depths == 0).sum()), depths.size, w[0] / w.sum())
    assert _within_5_sigma(int((depths < 16).sum()), depths.size, w[:16].sum() / w.sum())
    assert _within_5_sigma(depths.size, 8000, 0.6)


def test_a_pooling_of_0_is_a_table_never_looked_up():
    tr = generate([10, 20], batch=50, pooling=[0, 2], seed=4)
    assert (tr.lengths[0] == 0).all() and tr.table(0).size == 0 and tr.lengths[1].min() >= 1
    with pytest.raises(InputError, match="pooling >= 0"):
        generate([10], batch=5, pooling=-0.5)


def test_the_defaults_are_one_hot_bags_and_seed_0():
    a, b = generate([100, 9], batch=40, pooling=[3, 1]), generate([100, 9], batch=40, pooling=[3, 1], seed=0)
    assert (a.indices == b.indices).all() and (a.lengths == b.lengths).all()
    assert (generate([100, 9], batch=40).lengths == 1).all()


def test_malformed_traces_are_refused():
    idx, off, lens = np.array([1, 2, 0]), np.array([0, 2, 3]), np.array([[2, 1]])
    IndexTrace(idx, off, lens)  # well formed: one table, two bags
    IndexTrace(idx + 1, off, lens)  # row 0 never read is fine too
    with pytest.raises(InputError, match="lengths T x B"):
        IndexTrace(idx, off, lens.reshape(-1))
    with pytest.raises(InputError, match="lengths T x B"):
        IndexTrace(idx.reshape(1, -1), off, lens)
    with pytest.raises(InputError, match="negative index -1"):
        IndexTrace(np.array([1, -1, 0]), off, lens)


def test_a_table_read_once_gets_its_access_histogram():
    # Table "once" is read by one lookup in the whole trace, table "never" by none.
    tr = IndexTrace(np.array([5, 0, 1, 2]), np.array([0, 1, 1, 4, 4]), np.array([[1, 0], [3, 0]]), names=("once", "busy"))
    once, busy = tr.apply([Table("once", 8, 4), Table("busy", 3, 4)])
    assert once.access is not None and sum(once.access) == 1.0 and once.access[5] == 1.0
    assert busy.access == (1.0, 1.0, 1.0) and once.pooling_factor == 0.5 and busy.pooling_factor == 1.5
    (never,) = IndexTrace(np.zeros(0, np.int64), np.array([0, 0, 0]), np.array([[0, 0]])).apply([Table("never", 8, 4)])
    assert never.access is None and never.pooling_factor == 0.0


def test_a_trace_of_many_unnamed_tables_matches_them_by_position():
    # 300 tables: counts past CPython's small-int cache are compared by value.
    T = 300
    tr = IndexTrace(np.arange(T) % 7, np.arange(T + 1), np.ones((T, 1), np.int64))
    out = tr.apply([Table(f"t{i}", 7, 4) for i in range(T)])
    assert [t.access.index(1.0) for t in out] == [i % 7 for i in range(T)]
    with pytest.raises(InputError, match="300 tables for 299 planned"):
        tr.apply([Table(f"t{i}", 7, 4) for i in range(T - 1)])


def test_a_trace_of_no_tables_is_refused_naming_rows():
    with pytest.raises(InputError, match="rows: at least one table"):
        generate([], batch=4)
