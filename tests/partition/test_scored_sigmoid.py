"""Under an AUC budget a chain's trailing sigmoid that computes the scored output stays on the host.

A confident scorer (logits of several units): the card's sigmoid table ties those scores, the
float sigmoid of the offloaded logit keeps their order, which is all AUC reads.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import offload
from offload.partition.find import SCORE_SIGMOID_REASON
from offload.quant.metrics import auc


class Scorer(nn.Module):
    def __init__(self, functional: bool = False, tail: str = "squeeze"):
        super().__init__()
        torch.manual_seed(0)
        self.mlp = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
        with torch.no_grad():  # confident: logits spread over tens of units, most far below zero
            self.mlp[2].weight.mul_(40.0)
            self.mlp[2].bias.fill_(7.0)
        self.sig = nn.Sigmoid()
        self.functional, self.tail = functional, tail

    def forward(self, x):
        h = self.mlp(x)
        p = torch.sigmoid(h) if self.functional else self.sig(h)
        if self.tail == "squeeze":
            return p.squeeze(1)
        return p.squeeze(1) * 0.5 + 0.25  # not a reshape: the sigmoid does not compute the output's values


def _batches(seed: int, n: int = 4, rows: int = 512):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 6, generator=g),) for _ in range(n)]


def _labels(model, batches):
    with torch.no_grad():
        p = torch.cat([model(*b) for b in batches])
    return (torch.rand(p.shape, generator=torch.Generator().manual_seed(9)) < p).float()


def _scores(m, batches):
    with torch.no_grad():
        return torch.cat([m(*b) for b in batches]).double().numpy()


def _misordered(ref: np.ndarray, got: np.ndarray) -> int:
    """Pairs of rows ``ref`` orders strictly that ``got`` ties or swaps."""
    d_ref = np.sign(ref[:, None] - ref[None, :])
    d_got = np.sign(got[:, None] - got[None, :])
    return int(((d_ref != 0) & (d_got != d_ref)).sum()) // 2


def _offload(model, **kw):
    calib = _batches(1, n=2)
    return offload.offload(model, calib[0], ops=("mlp",), calib=calib, precision="auto", **kw)


def test_sigmoid_on_the_scored_output_stays_on_the_host_and_ranks_as_the_logit():
    for functional in (False, True):
        model = Scorer(functional).eval()
        hold = _batches(2)
        labels = _labels(model, hold)
        gm = _offload(model, holdout=(hold, labels), budget={"auc_drop": 0.001})
        rep = gm.offload_report
        chain = next(d for d in rep.decisions if d.kind == "mlp")
        sig = next(d for d in rep.decisions if d.kind == "sigmoid")
        assert chain.offloaded and "Sigmoid" not in chain.shape
        assert not sig.offloaded and sig.reason == SCORE_SIGMOID_REASON
        assert rep.budget["met"]
        # The offloaded chain ends at the logit; the host's sigmoid of it ranks rows as the logit does.
        unit = gm.get_submodule(chain.replacement)
        with torch.no_grad():
            logits = torch.cat([unit(*b) for b in hold]).double().numpy().reshape(-1)
        y = labels.numpy()
        assert len(np.unique(logits)) == len(np.unique(_scores(gm, hold)))
        assert auc(y, logits) == auc(y, _scores(gm, hold))


def test_the_card_sigmoid_ties_confident_scores_the_host_one_does_not():
    """Why the rule exists: the same chain, built the same way (a holdout measures, chooses nothing),
    with its sigmoid on the card ties scores: more pairs of rows the float model orders come out
    tied or swapped (what an AUC drop counts, whatever the labels)."""
    model = Scorer().eval()
    hold = _batches(2)
    labels = _labels(model, hold)
    split = _scores(_offload(model, holdout=(hold, labels)), hold)
    whole = _offload(model)  # no holdout scored by AUC: the sigmoid is offloaded with the chain
    assert any("Sigmoid" in d.shape for d in whole.offload_report.decisions if d.kind == "mlp")
    card = _scores(whole, hold)
    assert len(np.unique(card)) < len(np.unique(split))
    ref = _scores(model, hold)
    assert _misordered(ref, card) > _misordered(ref, split)


def test_sigmoid_stays_in_the_chain_unless_the_budget_is_an_auc_or_it_computes_the_output():
    hold = _batches(2)
    model = Scorer().eval()
    gm = _offload(model, holdout=(hold, None), budget={"max_abs_err": 0.05})
    assert any("Sigmoid" in d.shape for d in gm.offload_report.decisions if d.kind == "mlp")
    assert not any(d.kind == "sigmoid" for d in gm.offload_report.decisions)
    other = Scorer(tail="affine").eval()
    gm = _offload(other, holdout=(hold, _labels(other, hold)), budget={"auc_drop": 0.01})
    assert any("Sigmoid" in d.shape for d in gm.offload_report.decisions if d.kind == "mlp")
