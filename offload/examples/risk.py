"""The risk-scoring example: synthetic card transactions, a small MLP, its quantized bundle.

The features (all already scaled for the model; the generator documents each transform):

====  ======================  ==================================================================
 #    name                    meaning and scaling
====  ======================  ==================================================================
 0    amount                  log1p(amount in EUR), centred at log1p(40) and divided by 1.5
 1    hour_sin                sin(2 pi hour / 24) of the local transaction time
 2    hour_cos                cos(2 pi hour / 24)
 3    weekend                 1 on Saturday/Sunday, else 0
 4    merchant_risk           historical fraud rate of the merchant category, scaled to [0, 1]
 5    card_present            1 for chip/contactless at a terminal, 0 for card-not-present
 6    foreign                 1 when the merchant country differs from the card's
 7    distance                log1p(km from the cardholder's home) / 3
 8    txn_1h                  transactions on the card in the last hour / 3
 9    txn_24h                 transactions on the card in the last 24 h / 10
10    amount_vs_avg           log(amount / the card's 90-day average amount)
11    account_age             log1p(account age in days) / 7
12    new_device              1 when the device or terminal was never seen on this card
13    failed_logins           failed logins in the last 24 h / 3
14    chargebacks             chargebacks on the card in the last 90 days
15    velocity                log1p(EUR spent in the last hour) / 5
====  ======================  ==================================================================

The label comes from a fixed, non-linear fraud propensity over these features plus noise (about
4 % positives), so a 16-32-16-1 MLP learns it well but not perfectly.

Example::

    from offload.examples.risk import build_risk_bundle
    b = build_risk_bundle("risk_bundle")        # trains (a few seconds), quantizes, saves
    b.meta["auc_float"], b.meta["auc_quantized"]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import offload
from offload.quant.metrics import auc

__all__ = ["FEATURES", "MODEL_NAME", "make_transactions", "train_float_model", "build_risk_bundle"]

MODEL_NAME = "risk"
FEATURES = (
    "amount", "hour_sin", "hour_cos", "weekend", "merchant_risk", "card_present", "foreign", "distance",
    "txn_1h", "txn_24h", "amount_vs_avg", "account_age", "new_device", "failed_logins", "chargebacks", "velocity",
)  # fmt: skip


def make_transactions(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` synthetic transactions: features float32 [n, 16] (see the module doc) and labels {0, 1}."""
    rng = np.random.default_rng(seed)
    amount = rng.lognormal(np.log(40), 1.0, n)
    hour = rng.uniform(0, 24, n)
    weekend = (rng.random(n) < 2 / 7).astype(float)
    merchant_risk = rng.beta(1.2, 6.0, n)
    card_present = (rng.random(n) < 0.6).astype(float)
    foreign = (rng.random(n) < 0.08).astype(float)
    distance = rng.lognormal(2.0, 1.3, n)
    txn_1h = rng.poisson(0.6, n).astype(float)
    txn_24h = txn_1h + rng.poisson(3.0, n)
    avg = amount * rng.lognormal(0.0, 0.6, n)
    account_age = rng.exponential(700, n)
    new_device = (rng.random(n) < 0.1).astype(float)
    failed = rng.poisson(0.15, n).astype(float)
    chargebacks = rng.poisson(0.05, n).astype(float)
    velocity = amount * (1 + txn_1h) * rng.uniform(0.5, 1.5, n)
    x = np.stack(
        [
            (np.log1p(amount) - np.log1p(40)) / 1.5,
            np.sin(2 * np.pi * hour / 24),
            np.cos(2 * np.pi * hour / 24),
            weekend,
            merchant_risk,
            card_present,
            foreign,
            np.log1p(distance) / 3,
            txn_1h / 3,
            txn_24h / 10,
            np.log(amount / avg),
            np.log1p(account_age) / 7,
            new_device,
            failed / 3,
            chargebacks,
            np.log1p(velocity) / 5,
        ],
        axis=1,
    ).astype(np.float32)
    night = (hour < 5).astype(float)
    # Interactions make it worth an MLP: card-not-present x new device, foreign x far from home, night x big amounts.
    logit = (
        -4.6
        + 1.1 * x[:, 0]
        + 3.0 * merchant_risk
        + 1.4 * (1 - card_present) * new_device
        + 1.2 * foreign * (x[:, 7] > 1.5)
        + 0.9 * night * (x[:, 0] > 0.5)
        + 0.8 * np.clip(x[:, 10], 0, None)
        + 0.9 * np.minimum(txn_1h, 4) / 2
        - 0.5 * x[:, 11]
        + 0.7 * failed
        + 1.0 * chargebacks
        + rng.normal(0, 0.5, n)
    )
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return x, y


def train_float_model(x: np.ndarray, y: np.ndarray, *, hidden=(32, 16), sigmoid: bool = True, epochs: int = 30, seed: int = 0):
    """A torch ``Sequential`` 16-32-16-1 (ReLU), trained with Adam on BCE; sigmoid output unless told not."""

    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = x.shape[1]
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, 1))
    if sigmoid:
        layers.append(nn.Sigmoid())
    model = nn.Sequential(*layers)
    head = nn.Sequential(*layers[:-1]) if sigmoid else model  # train on logits: stable BCE
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).reshape(-1, 1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=g).split(512):
            opt.zero_grad()
            loss_fn(head(xt[idx]), yt[idx]).backward()
            opt.step()
    return model.eval()


def build_risk_bundle(out: str | Path, *, seed: int = 0, n_train: int = 20000, n_test: int = 5000, sigmoid: bool = True) -> Any:
    """Trains the risk MLP, quantizes it with ``offload.nn.MLP.from_float`` and saves the bundle.

    The bundle's model name is ``risk``; its meta records the feature names and both AUCs on a
    held-out set (float model, and the quantized model as the sim device computes it).
    """

    x, y = make_transactions(n_train + n_test, seed)
    xtr, ytr, xte, yte = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
    model = train_float_model(xtr, ytr, sigmoid=sigmoid, seed=seed)
    with torch.no_grad():
        s_float = model(torch.from_numpy(xte)).numpy().ravel()
    mlp = offload.nn.MLP.from_float(model, calib=xtr[:2000], precision="auto")
    s_quant = np.asarray(mlp.simulate(xte.astype(np.float64))).ravel()
    meta = {
        "model": MODEL_NAME,
        "features": list(FEATURES),
        "architecture": "16-32-16-1 relu" + (" sigmoid" if sigmoid else ""),
        "seed": seed,
        "n_train": n_train,
        "n_test": n_test,
        "positive_rate": float(y.mean()),
        "auc_float": auc(yte, s_float),
        "auc_quantized": auc(yte, s_quant),
    }
    offload.save(mlp, out, name=MODEL_NAME, meta=meta)
    return offload.load(out)
