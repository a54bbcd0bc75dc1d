"""A DLRM-style recommender with its embedding tables offloaded and its dense part kept on the host.

Model (Naumov et al., "Deep Learning Recommendation Model", 2019, dot interaction): 13 dense
features -> bottom MLP -> ``dim``; 8 sparse features, each a bag of ids pooled (sum) by an
``nn.EmbeddingBag`` of ``dim`` columns; pairwise dot products of the 9 vectors + the bottom output
-> top MLP -> click probability. All tables share ``dim`` (the dot interaction needs it).

Data: synthetic clicks. Ids follow a Zipf law (a few rows take most lookups, as in production
click logs), bag lengths vary per table; the label comes from a hidden teacher (per-row latent
propensities of the ids looked up plus a dense-feature term, plus noise) and the model is trained
on it briefly, so the float model's AUC is well above 0.5 and the offloaded model's AUC is
compared against it.

Full size: tables of 10^4 .. 10^6 rows at dim 32 (325 MiB of float tables); ``small=True``:
10^3 .. 10^4 rows at dim 16 (tests).

Example::

    from offload.examples.dlrm import run
    res = run(small=True)              # trains, offloads the 8 tables to the sim device, compares
    print(res.report); print(res.comparison); res.auc_float, res.auc_offload
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

import offload
from offload.data.synthetic import zipf_ids
from offload.quant.metrics import auc

__all__ = ["DLRMConfig", "DLRM", "ClickData", "make_clicks", "build", "build_with_data", "run", "DLRMResult", "TorchRecDLRM", "run_torchrec"]


@dataclass(frozen=True)
class DLRMConfig:
    num_dense: int = 13
    table_rows: tuple[int, ...] = (10_000, 30_000, 100_000, 300_000, 1_000_000, 20_000, 200_000, 1_000_000)
    dim: int = 32
    bottom: tuple[int, ...] = (64,)
    top: tuple[int, ...] = (64, 32)
    mean_bag: tuple[float, ...] = (1, 2, 4, 8, 3, 1, 6, 2)
    zipf_s: float = 1.05

    @classmethod
    def small(cls) -> "DLRMConfig":
        return cls(table_rows=(1_000, 2_000, 3_000, 5_000, 10_000, 1_500, 4_000, 10_000), dim=16, bottom=(32,), top=(32, 16))


def _mlp(sizes: list[int], last_act: nn.Module | None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        layers.append(nn.ReLU() if i < len(sizes) - 2 else (last_act or nn.Identity()))
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """``forward(dense [B, 13], indices (8 x 1-D), offsets (8 x [B]))`` -> click probability [B]."""

    def __init__(self, cfg: DLRMConfig):
        super().__init__()
        self.cfg = cfg
        self.bottom = _mlp([cfg.num_dense, *cfg.bottom, cfg.dim], nn.ReLU())
        # sparse gradients: a training step touches only the looked-up rows (SparseAdam), not 10^6 x dim
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, cfg.dim, mode="sum", sparse=True) for n in cfg.table_rows)
        n = len(cfg.table_rows) + 1
        li, lj = torch.triu_indices(n, n, offset=1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = _mlp([cfg.dim + n * (n - 1) // 2, *cfg.top, 1], nn.Sigmoid())
        for t in self.tables:  # DLRM's uniform(-1/sqrt(n), 1/sqrt(n)) initialisation keeps dots O(1)
            nn.init.uniform_(t.weight, -(t.num_embeddings ** -0.5) * 4, (t.num_embeddings ** -0.5) * 4)

    def interact(self, x: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
        z = torch.stack([x] + embs, dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))
        return torch.cat([x, dots[:, self.li, self.lj]], dim=1)

    def logits_input(self, dense: torch.Tensor, indices: Any, offsets: Any) -> torch.Tensor:
        x = self.bottom(dense)
        embs = [t(indices[i], offsets[i]) for i, t in enumerate(self.tables)]
        return self.interact(x, embs)

    def forward(self, dense: torch.Tensor, indices: Any, offsets: Any) -> torch.Tensor:
        return self.top(self.logits_input(dense, indices, offsets)).squeeze(1)


class TorchRecDLRM(nn.Module):
    """The same DLRM written the TorchRec way (needs the ``torchrec`` extra), with ``model``'s weights:
    an ``EmbeddingBagCollection`` over a ``KeyedJaggedTensor`` (features ``f0..f7``), a ``.float()``
    after each lookup, torchrec's ``MLP`` (Perceptrons calling ``torch.relu``) as the bottom, and a
    top MLP of Linears with functional ``torch.relu`` / ``torch.sigmoid``.

    ``forward(dense [B, 13], kjt)`` -> click probability [B], equal to ``model``'s.
    """

    def __init__(self, model: DLRM):
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.modules.mlp import MLP as TorchRecMLP

        super().__init__()
        cfg = model.cfg
        self.keys = [f"f{i}" for i in range(len(cfg.table_rows))]
        self.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=cfg.dim, num_embeddings=n, feature_names=[k])
                                                  for i, (n, k) in enumerate(zip(cfg.table_rows, self.keys))], device=torch.device("cpu"))
        self.bottom = TorchRecMLP(cfg.num_dense, [*cfg.bottom, cfg.dim])
        self.top = nn.ModuleList(m for m in model.top if isinstance(m, nn.Linear))
        self.register_buffer("li", model.li.clone(), persistent=False)
        self.register_buffer("lj", model.lj.clone(), persistent=False)
        with torch.no_grad():
            for i, t in enumerate(model.tables):
                self.ebc.embedding_bags[f"t{i}"].weight.copy_(t.weight)
            for p, lin in zip(self.bottom._mlp, [m for m in model.bottom if isinstance(m, nn.Linear)]):
                p._linear.weight.copy_(lin.weight)
                p._linear.bias.copy_(lin.bias)

    def forward(self, dense: torch.Tensor, kjt: Any) -> torch.Tensor:
        kt = self.ebc(kjt)
        embs = [kt[k].float() for k in self.keys]
        x = self.bottom(dense)
        z = torch.stack([x] + embs, dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))
        h = torch.cat([x, dots[:, self.li, self.lj]], dim=1)
        for lin in self.top[:-1]:
            h = torch.relu(lin(h))
        return torch.sigmoid(self.top[-1](h)).squeeze(1)


def to_kjt(data: "ClickData") -> Any:
    """``data``'s sparse features as a ``KeyedJaggedTensor`` (keys ``f0..f7``)."""
    from torchrec import KeyedJaggedTensor

    lengths = [torch.diff(torch.cat([o, o.new_tensor([len(i)])])) for i, o in zip(data.indices, data.offsets)]
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(len(lengths))], values=torch.cat(list(data.indices)),
                                               lengths=torch.cat(lengths))


@dataclass
class ClickData:
    dense: torch.Tensor
    indices: tuple[torch.Tensor, ...]
    offsets: tuple[torch.Tensor, ...]
    labels: torch.Tensor

    @property
    def inputs(self) -> tuple:
        return (self.dense, self.indices, self.offsets)

    def to(self, device: Any) -> "ClickData":
        return ClickData(self.dense.to(device), tuple(i.to(device) for i in self.indices), tuple(o.to(device) for o in self.offsets), self.labels.to(device))

    def batches(self, size: int) -> list["ClickData"]:
        out = []
        for s in range(0, len(self.labels), size):
            e = min(s + size, len(self.labels))
            idx, off = [], []
            for i, o in zip(self.indices, self.offsets):
                full = torch.cat([o, o.new_tensor([len(i)])])
                lo, hi = int(full[s]), int(full[e])
                idx.append(i[lo:hi])
                off.append(o[s:e] - lo)
            out.append(ClickData(self.dense[s:e], tuple(idx), tuple(off), self.labels[s:e]))
        return out


class _Teacher:
    """Hidden click propensity: a latent score per row of every table + a dense-feature term."""

    def __init__(self, cfg: DLRMConfig, seed: int):
        rng = np.random.default_rng(seed + 1000)
        self.row_score = [rng.normal(0, 1.0, n).astype(np.float32) for n in cfg.table_rows]
        self.w = rng.normal(0, 0.6, cfg.num_dense).astype(np.float32)
        # rank -> row id: the popular ids are spread over the table, not rows 0..k.
        self.perm = [rng.permutation(n) for n in cfg.table_rows]


def make_clicks(cfg: DLRMConfig, n: int, seed: int = 0, teacher: _Teacher | None = None) -> ClickData:
    """``n`` synthetic impressions with Zipf-distributed ids and teacher labels (about 25 % clicks)."""
    rng = np.random.default_rng(seed)
    teacher = teacher or _Teacher(cfg, 0)
    dense = rng.lognormal(0.0, 1.0, (n, cfg.num_dense)).astype(np.float32)
    dense = np.log1p(dense)  # DLRM's Criteo preprocessing: log(1 + x) of the counts
    logit = (dense - dense.mean(0)) @ teacher.w
    indices, offsets = [], []
    for t, rows in enumerate(cfg.table_rows):
        lens = 1 + rng.poisson(max(cfg.mean_bag[t] - 1, 0), n)
        ids = zipf_ids(rng, rows, int(lens.sum()), cfg.zipf_s, teacher.perm[t])
        off = np.concatenate([[0], np.cumsum(lens)[:-1]])
        bag_score = np.add.reduceat(teacher.row_score[t][ids], off) / np.sqrt(lens)
        logit += 0.5 * bag_score
        indices.append(torch.from_numpy(ids.astype(np.int64)))
        offsets.append(torch.from_numpy(off.astype(np.int64)))
    logit = logit - np.quantile(logit, 0.75) + rng.normal(0, 0.5, n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-2.0 * logit))).astype(np.float32)
    return ClickData(torch.from_numpy(dense), tuple(indices), tuple(offsets), torch.from_numpy(labels))


def train(model: DLRM, data: ClickData, steps: int, batch: int = 1024, lr: float = 3e-3, seed: int = 0) -> DLRM:
    """A few Adam steps of BCE on the sigmoid output (enough to learn the teacher's strongest signals)."""
    torch.manual_seed(seed)
    sparse = [p for t in model.tables for p in t.parameters()]
    dense = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    opts = [torch.optim.SparseAdam(sparse, lr=lr), torch.optim.Adam(dense, lr=lr)]
    parts = data.batches(batch)
    loss_fn = nn.BCELoss()
    model.train()
    threads = torch.get_num_threads()
    # Small ops: intra-op threads only add synchronisation (10x slower on a loaded 2-core machine).
    torch.set_num_threads(1)
    try:
        for s in range(steps):
            b = parts[s % len(parts)]
            for opt in opts:
                opt.zero_grad()
            loss_fn(model(*b.inputs), b.labels).backward()
            for opt in opts:
                opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def build_with_data(small: bool = False, seed: int = 0, n_train: int | None = None, steps: int | None = None
                    ) -> tuple[DLRM, Callable[[int, int], ClickData], ClickData]:
    """:func:`build` and the training impressions (calibration data comes from them)."""
    cfg = DLRMConfig.small() if small else DLRMConfig()
    torch.manual_seed(seed)
    model = DLRM(cfg)
    teacher = _Teacher(cfg, seed)
    n_train = n_train or (16_384 if small else 65_536)
    data = make_clicks(cfg, n_train, seed=seed + 1, teacher=teacher)
    train(model, data, steps if steps is not None else (150 if small else 100), seed=seed)
    return model, (lambda n, s: make_clicks(cfg, n, seed=s, teacher=teacher)), data


def build(small: bool = False, seed: int = 0, n_train: int | None = None, steps: int | None = None) -> tuple[DLRM, Callable[[int, int], ClickData]]:
    """A trained DLRM and ``make(n, seed) -> ClickData`` drawing from the same teacher."""
    model, make, _ = build_with_data(small, seed, n_train, steps)
    return model, make


@dataclass
class DLRMResult:
    """AUCs are on the test impressions, which neither calibration nor the budget search saw;
    ``report.budget`` is the figure on the holdout the search used."""

    report: Any
    comparison: Any
    auc_float: float
    auc_offload: float
    outputs_device: str
    n_eval: int
    offloaded: Any = field(repr=False, default=None)
    model: Any = field(repr=False, default=None)
    test_data: Any = field(repr=False, default=None)
    n_calib: int = 0

    def summary(self) -> str:
        c = self.comparison
        tables = calls = 0
        for k in self.offloaded.offload_kernels() if hasattr(self.offloaded, "offload_kernels") else ():
            n = len(getattr(k.spec, "tables", ()))
            tables += n
            calls += n > 1
        chains = sum(d.offloaded and d.kind == "mlp" for d in self.report.decisions)
        what = f"{tables} table{'s' * (tables != 1)} offloaded ({calls} table-batched call{'s' * (calls != 1)})"
        if chains:
            what += f", {chains} MLP chain{'s' * (chains != 1)}"
        budget = ""
        if self.report.budget is not None:
            b = self.report.budget
            lim = "" if b["limit"] is None else f" <= {b['limit']:g}: {'met' if b['met'] else 'NOT met'}"
            budget = f"; held-out {b['metric']} {b['measured']:.4g}{lim}"
        return (f"DLRM: {what}, the rest on {self.outputs_device}; output cosine {c.min_cosine:.6f}, max |err| {c.max_abs_err:.2e}; "
                f"calibrated on {self.n_calib} training impressions{budget}; "
                f"AUC float {self.auc_float:.4f} -> offloaded {self.auc_offload:.4f} on {self.n_eval} test impressions")


def _holdout(batches: list[ClickData], inputs: Callable[[ClickData], tuple]) -> tuple[list[tuple], torch.Tensor]:
    return [inputs(b) for b in batches], torch.cat([b.labels for b in batches])


def run(small: bool = False, device: str = "sim", dense_device: str = "cpu", n_eval: int = 4096, fmt: str = "ap_fixed<16,6>",
        seed: int = 0, steps: int | None = None, ops: tuple[str, ...] = ("embedding_bag",), budget: dict | None = None,
        precision: Any = "auto") -> DLRMResult:
    """Train the DLRM, offload its tables (and MLPs when ``ops`` says so; the rest stays on
    ``dense_device``), compare with float on test impressions.

    MLP chains calibrate on ``n_calib`` training impressions; ``budget`` (e.g. ``{"auc_drop": 0.001}``) is
    held on ``n_eval`` held-out impressions; the AUCs are on another ``n_eval`` test impressions.

    Example::

        res = run(small=True); print(res.summary())
    """

    model, make, train_data = build_with_data(small=small, seed=seed, steps=steps)
    model = model.to(dense_device)
    calib = [b.to(dense_device).inputs for b in train_data.batches(512)[:4]]
    test = make(n_eval, seed + 7).to(dense_device)
    holdout = None
    if budget is not None:
        holdout = _holdout(make(n_eval, seed + 5).to(dense_device).batches(1024), lambda b: b.inputs)
    gm = offload.offload(model, calib[0], ops=ops, calib=calib, device=device, fmt=fmt, precision=precision,
                         holdout=holdout, budget=budget)
    cmp = offload.compare(model, gm, test.inputs)
    with torch.no_grad():
        p_float = model(*test.inputs)
        p_off = gm(*test.inputs)
    return DLRMResult(gm.offload_report, cmp, auc(test.labels.cpu(), p_float.cpu()), auc(test.labels.cpu(), p_off.cpu()),
                      str(p_off.device), n_eval, gm, model, test, n_calib=512 * len(calib))


def run_torchrec(small: bool = False, device: str = "sim", n_eval: int = 4096, fmt: str = "ap_fixed<16,6>", seed: int = 0,
                 steps: int | None = None, trained: tuple | None = None,
                 ops: tuple[str, ...] = ("embedding_bag", "mlp"), budget: dict | None = None, precision: Any = "auto",
                 n_calib: int = 2048) -> DLRMResult:
    """:func:`run` on :class:`TorchRecDLRM` (same trained weights): the EBC's tables and the MLP chains
    (torchrec's MLP, functional activations) offloaded, a KeyedJaggedTensor in.

    MLP chains calibrate on ``n_calib`` training impressions; ``budget`` (e.g. ``{"auc_drop": 0.001}``, with
    ``precision="auto"``: one precision search over the EBC and both chains) is held on ``n_eval``
    held-out impressions and the AUCs are measured on ``n_eval`` test impressions. ``trained``:
    ``(model, test_data)`` or ``(model, test_data, train_data)`` of an earlier :func:`run`, instead of
    training; without training data the first quarter of ``test_data`` calibrates, a disjoint
    quarter is the holdout and the rest is tested.
    """
    if trained is None:
        model, make, train_data = build_with_data(small=small, seed=seed, steps=steps)
        test = make(n_eval, seed + 7)
        held = make(n_eval, seed + 5)
    else:
        model, data, *rest = trained
        data = data.to("cpu")
        parts = data.batches(max(1, len(data.labels) // 4))
        if rest:
            train_data, held, test = rest[0], parts[0], data
        else:
            train_data, held, test = parts[0], parts[1], _tail(data, 2 * len(parts[0].labels))
    trm = TorchRecDLRM(model.cpu()).eval()
    test = test.to("cpu")
    calib = [(b.dense, to_kjt(b)) for b in train_data.to("cpu").batches(512)[:max(1, n_calib // 512)]]
    holdout = _holdout(held.to("cpu").batches(1024), lambda b: (b.dense, to_kjt(b))) if budget is not None else None
    inputs = (test.dense, to_kjt(test))
    gm = offload.offload(trm, calib[0], ops=ops, calib=calib, device=device, fmt=fmt, precision=precision,
                         holdout=holdout, budget=budget)
    cmp = offload.compare(trm, gm, inputs)
    with torch.no_grad():
        p_float = trm(*inputs)
        p_off = gm(*inputs)
    return DLRMResult(gm.offload_report, cmp, auc(test.labels, p_float), auc(test.labels, p_off), str(p_off.device),
                      len(test.labels), gm, trm, test, n_calib=sum(len(c[0]) for c in calib))


def _tail(data: ClickData, start: int) -> ClickData:
    """``data`` from impression ``start`` on."""
    return data.batches(start)[1] if start < len(data.labels) else data


def main() -> None:  # pragma: no cover - exercised by examples/dlrm.py and the demo
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="10^3..10^4-row tables (seconds) instead of 10^4..10^6")
    ap.add_argument("--device", default="sim")
    ap.add_argument("--dense-device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--fmt", default="ap_fixed<16,6>")
    ap.add_argument("--torchrec", action="store_true", help="the TorchRec form: EBC and both MLPs offloaded")
    ap.add_argument("--mlp", action="store_true", help="offload the MLP chains too (the plain form)")
    ap.add_argument("--auc-budget", type=float, default=None, help="model-level budget: held-out AUC drop at most this")
    a = ap.parse_args()
    budget = None if a.auc_budget is None else {"auc_drop": a.auc_budget}
    if a.torchrec:
        res = run_torchrec(small=a.small, device=a.device, fmt=a.fmt, budget=budget)
    else:
        res = run(small=a.small, device=a.device, dense_device=a.dense_device, fmt=a.fmt, budget=budget,
                  ops=("embedding_bag", "mlp") if a.mlp else ("embedding_bag",))
    print(res.report)
    print(res.comparison)
    print(res.summary())


if __name__ == "__main__":  # pragma: no cover
    main()
