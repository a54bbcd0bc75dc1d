"""Partition a PyTorch model: offload embedding lookups and scoring MLPs, keep everything else.

``offload.offload`` traces the model with torch.fx, replaces ``nn.EmbeddingBag`` /
``nn.Embedding`` modules, ``F.embedding_bag`` calls and maximal MLP chains with ``offload.nn``
modules running on an offload device, and leaves every other node untouched on its original
device. Several tables with the same dim, mode and format whose inputs are ready at the same point
become one table-batched call. Whatever cannot be offloaded (untraceable model, unsupported layer,
a table too large for the card, a factory's refusal) stays on the host and the report says why.

It runs one pass a module, each module's ``apply(state)``, over one
:class:`~offload.partition.state.State`: ``find`` (trace, candidates), ``calibrate`` (MLP inputs),
``budget`` (card memory), ``group`` (table batching), ``replace`` (graph surgery); ``report`` holds
the report, ``compare`` checks the result.

Example::

    gm = offload.offload(model, (indices, offsets, dense), ops=("embedding_bag",), device="sim")
    print(gm.offload_report)                      # every candidate: offloaded or kept, and why
    print(offload.compare(model, gm, (indices, offsets, dense)))
"""

from __future__ import annotations

from typing import Any, Sequence

import torch.nn as nn

from offload.hls.cards import Card
from offload.partition import accuracy, calibrate, find, group, replace
from offload.partition import budget as card_budget
from offload.partition.compare import Comparison, compare
from offload.partition.find import OPS
from offload.partition.report import Decision, OffloadReport, untraceable
from offload.partition.state import start

__all__ = ["offload", "compare", "OffloadReport", "Decision", "Comparison"]


def offload(
    model: nn.Module,
    example_inputs: Any,
    ops: Sequence[str] = OPS,
    calib: Any = None,
    device: Any = "sim",
    card: str | Card = "u55c",
    fmt: str = "ap_fixed<16,6>",
    precision: Any = "auto",
    reuse_factor: int = 1,
    batch_tables: bool = True,
    max_bag_size: int | None = None,
    holdout: Any = None,
    budget: dict[str, float] | None = None,
    plan: Any = None,
    launch: str | None = None,
) -> nn.Module:
    """Return ``model`` with embedding lookups and MLP chains moved to an offload device.

    ``example_inputs``: the forward's positional args (a tuple, or one tensor). ``calib``: a list of
    input batches on which MLP chains record their input activations for quantization (default:
    ``[example_inputs]``). ``fmt``: table storage format. ``card``: whose memory bounds the tables.
    ``max_bag_size``: the longest bag the traffic is declared to carry; it sizes the tables'
    accumulators (default :data:`offload.kernels.embedding.DEFAULT_MAX_BAG_SIZE`).
    ``holdout``: ``(batches, labels)``, held-out input batches (none may repeat a calibration batch)
    and their 0/1 labels; ``budget``: ``{"auc_drop": limit}`` or ``{"max_abs_err": limit}`` on the
    model's output over the holdout. With both, one precision search over every offloaded table and
    chain keeps sensitive ones wide and puts back on the host what no precision can offload within
    the budget (:mod:`offload.partition.accuracy`); ``offload_report.budget`` is
    ``{"metric", "limit", "measured", "met"}``.
    ``plan``: an :class:`offload.plan.Plan`; every TorchRec EBC found becomes an
    :class:`offload.nn.ShardedEmbeddingBagCollection` over the plan's cards (local engine).
    ``launch``: how the device starts the offloaded kernels, for a ``device`` spec string:
    ``"per_call"`` (a kernel run per call), ``"persistent"`` (the device is opened once with
    ``open_device(device, launch="persistent")``: kernels started at load, calls through a ring;
    a device without that mode raises :class:`~offload.sim.errors.UnsupportedError`) or ``"auto"``
    (persistent where the device offers it, else per call). ``None`` (default): as before, per call
    on the process's shared device, or an open Device as it was opened (giving ``launch`` with an
    open Device is an :class:`~offload.sim.errors.InputTypeError`). Each offloaded row of the
    report says its launch mode (``Decision.launch``), and a note says why not persistent where
    ``"auto"`` could not be.
    The result is a ``torch.fx.GraphModule`` (the unchanged model wrapped, when it cannot be traced)
    with ``offload_report``.

    Example::

        gm = offload.offload(dlrm, (idx, off, dense), ops=("embedding_bag",))
        print(gm.offload_report)
    """
    st = start(model, example_inputs, ops=tuple(ops), calib=calib, device=device, card=card, fmt=fmt,
               precision=precision, reuse_factor=reuse_factor, batch_tables=batch_tables, max_bag_size=max_bag_size,
               holdout=holdout, budget=budget, plan=plan, launch=launch)
    opened = st.device if st.device is not device else None  # a persistent device opened for this call
    try:
        find.apply(st)
        if st.gm is None:
            # Nothing runs on the device opened for this call: it goes back now.
            if opened is not None:
                opened.close()
            return untraceable(model, st.trace_error, device, st.card)
        for step in (calibrate, card_budget, group, replace, accuracy):
            step.apply(st)
        _report_launch(st)
        return replace.finish(st)
    except BaseException:
        if opened is not None:
            opened.close()
        raise


def _report_launch(st) -> None:
    """Each offloaded unit's launch mode in its report row, and why not persistent where asked."""
    if st.launch_why:
        st.report.notes.append(f"launch: per_call, persistent is not possible on device {st.report.device!r} ({st.launch_why})")
    for d in st.report.offloaded:
        # A plan's sharded collection runs on the devices its engine opens, one run per call.
        d.launch = "per_call" if st.plan is not None and d.kind == "ebc" else st.launch
