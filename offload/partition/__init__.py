"""Partition a PyTorch model: offload embedding lookups and scoring MLPs, keep everything else.

Example::

    gm = offload.offload(model, (indices, offsets, dense), ops=("embedding_bag",), device="sim")
    print(gm.offload_report)                      # every candidate: offloaded or kept, and why
    print(offload.compare(model, gm, (indices, offsets, dense)))
"""

from offload.partition.compare import Comparison, compare
from offload.partition.core import Decision, OffloadReport, offload

__all__ = ["offload", "compare", "OffloadReport", "Decision", "Comparison"]
