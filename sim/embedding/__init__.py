"""The embedding lookup kernel's arithmetic: the step-by-step reference (:mod:`.reference`, imported
here) and the fused compiled path (:mod:`.fused`, imported on its own: it loads numba). The
``embedding`` kernel kind chooses between them.

Example::

    from offload.sim.embedding import Pooling, PooledTable, lookup
    out = lookup(pooling, [table0], [None], indices, offsets)
"""

from offload.sim.embedding.reference import (
    MODES,
    PooledTable,
    Pooling,
    drop_padding,
    gather_values,
    lookup,
    pool_bags,
    product_type,
    round_div,
    rowwise_value_type,
)

__all__ = [
    "MODES",
    "PooledTable",
    "Pooling",
    "drop_padding",
    "gather_values",
    "lookup",
    "pool_bags",
    "product_type",
    "round_div",
    "rowwise_value_type",
]
