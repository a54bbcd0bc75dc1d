"""The one object every partition pass reads and writes (the role FINN's ``ModelWrapper`` plays).

``offload.offload`` builds a :class:`State` with :func:`start` and hands it to the passes in turn:
find (trace, candidates), calibrate (MLP inputs), budget (card memory), group (table batching),
replace (graph surgery). Each pass fills its own fields; none keeps anything elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx as fx
import torch.nn as nn

from offload.hls.cards import LAUNCH_CHOICES, Card, get_card
from offload.host import Device, open_device
from offload.partition import holdout as holdout_
from offload.partition.find import Candidate, Skipped
from offload.partition.report import Decision, OffloadReport
from offload.sim.errors import InputError, InputTypeError, OffloadError

__all__ = ["State", "start", "table_key", "TABLE_KINDS"]

TABLE_KINDS = ("embedding_bag", "embedding")


@dataclass
class State:
    """The model being partitioned, the user's choices, and what each pass found or decided."""

    # the call: model, example inputs as positional args, and the user's choices
    model: nn.Module
    ops: tuple[str, ...]
    device: str | Device | None
    card: Card
    fmt: str
    precision: Any
    reuse_factor: int
    batch_tables: bool
    calib: list[tuple]  # input batches MLP chains calibrate on (the example inputs when none given)
    calib_given: bool
    report: OffloadReport
    max_bag_size: int | None = None  # the declared longest bag of the tables (None: the kernels' default)
    holdout: Any = None  # offload.partition.holdout.Holdout: the data and limit of a model-level budget
    plan: Any = None  # offload.plan.Plan: where every EBC's tables go (sharded over its cards)
    launch: str = "per_call"  # how the device runs the offloaded kernels (resolved from offload()'s launch=)
    launch_why: str = ""  # why it is not persistent, where persistence was asked for ("auto") and is not possible
    # find
    gm: fx.GraphModule | None = None
    trace_error: Exception | None = None
    candidates: list[Candidate] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    decisions: dict[str, Decision] = field(default_factory=dict)  # candidate name -> its report row
    # calibrate
    recorded: dict[str, torch.Tensor] = field(default_factory=dict)  # MLP chain name -> its input rows
    # budget
    batchable: list[Candidate] = field(default_factory=list)  # bag tables on the card, called once
    # group
    groups: list[list[Candidate]] = field(default_factory=list)
    # replace: offloaded graph node -> float node it stands for; offload module -> its float module
    node_map: dict[str, str] = field(default_factory=dict)
    float_refs: dict[str, nn.Module] = field(default_factory=dict)


def table_key(c: Candidate) -> tuple:
    """Identity of the table a candidate reads (MLP chains are never shared)."""
    if c.kind == "mlp":
        return ("mlp", c.name)
    return (c.kind, c.targets[0], c.bag_mode)


def _as_args(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _calib_batches(calib: Any, example: tuple) -> list[tuple]:
    if calib is None:
        return [example]
    if isinstance(calib, torch.Tensor):
        return [(calib,)]
    if isinstance(calib, np.ndarray):  # one NumPy batch of features
        return [(torch.as_tensor(calib),)]
    if not isinstance(calib, (list, tuple)) or not calib:
        raise TypeError("calib: expected a non-empty list of example input batches (each a tuple of args or a tensor)")
    return [_as_args(b) for b in calib]


def _device_name(device: str | Device | None) -> str:
    return str(device) if device is None or isinstance(device, str) else device.name




def _launch_device(device: str | Device | None, launch: str | None) -> tuple[str | Device | None, str, str]:
    """``(device to build on, its launch mode, why not persistent)`` for ``offload()``'s ``device``
    and ``launch``. ``None``: today's behaviour (a spec string runs per call on the process's
    shared device; a Device object as it was opened). A persistent device is opened here, once,
    and every offloaded unit loads onto it; ``"auto"`` falls back to per call with the reason."""
    if launch is None:
        return device, getattr(device, "launch", "per_call") if isinstance(device, Device) else "per_call", ""
    if launch not in LAUNCH_CHOICES:
        raise InputError(f"launch: {launch!r} is not one of {list(LAUNCH_CHOICES)}")
    if device is not None and not isinstance(device, str):
        raise InputTypeError(f"launch={launch!r} with device={getattr(device, 'name', type(device).__name__)!r}, an open device: its launch mode "
                             "was fixed by open_device(..., launch=); pass a device spec string with launch=, or the device alone")
    if launch == "per_call":
        return device, "per_call", ""
    try:
        return open_device(device, launch="persistent"), "persistent", ""
    except OffloadError as e:
        if launch == "persistent":
            raise
        return device, "per_call", f"{type(e).__name__}: {e}"


def start(model: nn.Module, example_inputs: Any, *, ops: tuple[str, ...], calib: Any, device: str | Device | None,
          card: str | Card, fmt: str, precision: Any, reuse_factor: int, batch_tables: bool,
          max_bag_size: int | None = None, holdout: Any = None, budget: Any = None, plan: Any = None,
          launch: str | None = None) -> State:
    """Check ``offload.offload``'s arguments and hold them in a fresh :class:`State`; with
    ``launch`` other than None and per call, the device is opened here (:func:`_launch_device`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(reuse_factor, int) or reuse_factor < 1:
        raise ValueError(f"reuse_factor: expected an integer >= 1, got {reuse_factor!r}")
    card_ = get_card(card)
    batches = _calib_batches(calib, _as_args(example_inputs))
    report = OffloadReport(device=_device_name(device), card=card_.name, fmt=fmt)
    if max_bag_size is not None and (isinstance(max_bag_size, bool) or not isinstance(max_bag_size, int) or max_bag_size < 1):
        raise ValueError(f"max_bag_size: expected an integer >= 1 or None, got {max_bag_size!r}")
    if plan is not None:
        from offload.plan import Plan

        if not isinstance(plan, Plan):
            raise TypeError(f"plan: expected an offload.plan.Plan, got {type(plan).__name__}")
    hold = holdout_.check(holdout, budget, batches)
    dev, mode, why = _launch_device(device, launch)  # last: nothing is opened for a call refused above
    return State(model, tuple(ops), dev, card_, fmt, precision, reuse_factor, batch_tables, batches, calib is not None, report,
                 max_bag_size, hold, plan, mode, why)
