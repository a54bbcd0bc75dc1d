"""Placement planning for embedding tables larger than a card: tables onto HBM pseudo-channels,
DDR banks, on-chip memory, cards and hosts (:func:`shard`), the :class:`Plan` it returns, and index
traces (:mod:`offload.plan.trace`) for pooling factors and access counts.

Example::

    tables = offload.plan.tables_of(ebc)
    topo = offload.plan.Topology.uniform("u55c", hosts=2, cards_per_host=2)
    plan = offload.plan.shard(tables, topo, constraints={"t3": {"sharding": "row_wise"}, "t7": {"card": (0, 1)}})
    print(plan.explain()); plan.to_json("plan.json")
"""

from offload.plan.plan import SHARDING_TYPES, Plan, Shard, TablePlan
from offload.plan.planner import PlanError, shard
from offload.plan.tables import Table, tables_of
from offload.plan.topology import Topology, Unit
from offload.plan import trace  # noqa: F401  (offload.plan.trace: index traces)

__all__ = ["trace", "Table", "tables_of", "Topology", "Unit", "shard", "PlanError", "Plan", "TablePlan", "Shard", "SHARDING_TYPES"]
