"""``offload.advise``: should each embedding table / MLP of a model go to the card, and at which batch sizes?

For every offload candidate (found as ``offload.offload`` finds them) and every batch size: the
measured latency on the candidate's current device (torch, median of repeats, inputs resampled from
what the candidate saw on ``example_inputs``), the predicted card latency in both launch modes
(``per_call``: buffer syncs + one ``xrt::run``; ``persistent``: a kernel already running that serves
a ring of request slots, in host memory where the platform reaches it, MODELLED, not measured on a
card; :mod:`offload.advisor.model`) and
the predicted resources against the card's budget (:mod:`offload.hls.cards`, datasheet numbers).
Verdict: ``offload`` when it fits and the card is faster in the chosen launch mode (``launch="auto"``:
the faster mode at each batch size), else ``keep``, with the numbers.

Example::

    adv = offload.advise(model, (idx, off, dense), batch_sizes=(1, 64, 4096), card="u55c", launch="auto")
    print(adv)                               # table: host vs card latency in both modes, resources, verdict
    adv.verdict("emb_user", 4096)            # "offload" / "keep"
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch
import torch.fx as fx
import torch.nn as nn
from rich.table import Table

from offload.advisor.model import CARD_RING_SYNCS, LAUNCHES, Prediction, check_launch, predict_lookup, predict_mlp
from offload.hls.cards import (HOST_CARD_ROUND_TRIP_S, KERNEL_LAUNCH_REPORTED_S, KERNEL_LAUNCH_S, PCIE_TRANSFER_LATENCY_S,
                               PERSISTENT_POLL_INTERVAL_S, Card, get_card, ring_memory)
from offload.partition.find import EMB_BAG_PARAMS, OPS, Candidate, find_candidates, trace
from offload.render import RichReport

__all__ = ["advise", "Advice", "Estimate"]

_RES_KEYS = ("DSP", "BRAM36", "URAM", "LUT", "HBM_bytes")
AUTO = "auto"  # launch: the faster of LAUNCHES at each batch size


@dataclass
class Estimate:
    """One candidate at one batch size; the card parts are those of ``launch``, and ``modes`` holds
    every launch mode's parts (``transfer_s``, ``launch_s``, ``kernel_s``, ``card_s``)."""

    name: str
    kind: str
    shape: str
    batch: int
    host_device: str
    host_s: float
    transfer_s: float
    launch_s: float
    kernel_s: float
    resources: dict[str, float]
    fits: bool
    verdict: str
    why: str
    launch: str = "per_call"
    modes: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def card_s(self) -> float:
        return self.transfer_s + self.launch_s + self.kernel_s

    @property
    def speedup(self) -> float:
        return self.host_s / self.card_s if self.card_s > 0 else float("inf")


@dataclass
class Advice(RichReport):
    """Estimates for every candidate and batch size, against one card."""

    text_width: ClassVar[int] = 160
    card: Card
    batch_sizes: tuple[int, ...]
    rows: list[Estimate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    launch: str = "per_call"  # as asked: a key of LAUNCHES or "auto"

    def verdict(self, name: str, batch: int) -> str:
        for r in self.rows:
            if r.name == name and r.batch == batch:
                return r.verdict
        raise KeyError(f"no estimate for {name!r} at batch {batch}; names: {sorted({r.name for r in self.rows})}")

    def to_dict(self) -> dict:
        return {"card": _card_budget(self.card), "batch_sizes": list(self.batch_sizes), "launch": self.launch, "notes": list(self.notes),
                "rows": [dict(asdict(r), card_s=r.card_s, speedup=r.speedup) for r in self.rows]}

    def table(self) -> Table:
        c = self.card
        t = Table(title=f"offload advise: card {c.name} ({c.datasheet}: {c.dsp} DSP, {c.bram36} BRAM36, {c.uram} URAM, "
                        f"{c.lut // 1000}K LUT, {c.memory_bytes / 2**30:.0f} GiB), launch {self.launch}; "
                        "persistent figures are MODELLED, not measured on a card")
        for col in ("candidate", "shape", "batch", "host", *_MODE_COLUMNS.values(), "DSP", "BRAM36", "URAM", "LUT", "HBM/DDR", "verdict"):
            t.add_column(col, overflow="fold")
        for r in self.rows:
            res = r.resources
            parts = [f"{_us(m['card_s'])} = {_us(m['transfer_s'])}+{_us(m['launch_s'])}+{_us(m['kernel_s'])}" for m in
                     (r.modes[mode] for mode in _MODE_COLUMNS)]
            t.add_row(r.name, r.shape, str(r.batch), f"{_us(r.host_s)} ({r.host_device})", *parts,
                      f"{res['DSP']:.0f}", f"{res['BRAM36']:.0f}", f"{res['URAM']:.0f}", f"{res['LUT']:.0f}", f"{res['HBM_bytes'] / 2**20:.1f} MiB",
                      f"{r.verdict}: {r.why}")
        return t

    def renderables(self) -> list:
        return [self.table(), *(f"note: {n}" for n in self.notes)]


# One column a launch mode, with what its three parts are.
_MODE_COLUMNS = {"per_call": "card per-call = xfer+launch+kernel", "persistent": "card persistent (MODELLED) = xfer+poll+kernel"}


def _card_budget(c: Card) -> dict:
    """The flat card budget ``offload advise --json`` has always printed (its readers use these keys)."""
    hbm, ddr = c.hbm, c.ddr
    return {"name": c.name, "datasheet": c.datasheet, "dsp": c.dsp, "bram36": c.bram36, "uram": c.uram, "lut": c.lut,
            "hbm_bytes": hbm.bytes if hbm else 0, "hbm_channels": hbm.banks if hbm else 0, "hbm_channel_bps": hbm.bank_bps if hbm else 0.0,
            "ddr_bytes": ddr.bytes if ddr else 0, "ddr_channels": ddr.banks if ddr else 0,
            "pcie_bps": c.pcie_bps, "kernel_clock_hz": c.kernel_clock_hz}


def _us(s: float) -> str:
    if s < 1e-5:  # persistent calls and kernel times are a few microseconds or less
        return f"{s * 1e6:.2g} us" if s < 1e-7 else f"{s * 1e6:.1f} us"
    return f"{s * 1e6:.0f} us" if s < 1e-2 else f"{s * 1e3:.1f} ms"


def _fmt_bits(fmt: str) -> int:
    """Bits of one table value in ``fmt`` (ValueError for a format the model does not know)."""
    if fmt == "int8_rowwise":
        return 8
    m = re.match(r"\s*ap_u?(?:fixed|int)<\s*(\d+)", fmt)
    if m is None:
        raise ValueError(f"fmt {fmt!r}: expected 'ap_fixed<W,I>', 'ap_int<W>' or 'int8_rowwise'")
    return int(m.group(1))


class _InputRecorder(fx.Interpreter):
    """Runs the graph and keeps the arguments of the nodes in ``firsts``."""

    def __init__(self, gm: fx.GraphModule, firsts: dict[str, Candidate]):
        super().__init__(gm)
        self.firsts = firsts
        self.inputs: dict[str, tuple[tuple, dict]] = {}

    def run_node(self, n: fx.Node) -> Any:
        if n.name in self.firsts:
            self.inputs[n.name] = self.fetch_args_kwargs_from_env(n)
        return super().run_node(n)


def _device_of(m: nn.Module) -> torch.device:
    p = next(iter(m.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _median_time(fn: Callable[[], Any], dev: torch.device, repeats: int, budget_s: float) -> float:
    """Median wall time of ``fn`` over up to ``repeats`` runs (at least 3, stopping after ``budget_s``)."""
    with torch.inference_mode():
        for _ in range(2):
            fn()
        _sync(dev)
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < budget_s):
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bag_inputs(c: Candidate, args: tuple, kwargs: dict, batch: int, gen: torch.Generator) -> tuple[Callable[[], Any], int, int]:
    """A call of the float bag on ``batch`` bags resampled from the recorded ones; (call, lookups, pooling)."""
    if c.functional:
        named = dict(zip(EMB_BAG_PARAMS, args))
    else:
        named = dict(zip(("input", "offsets"), args))
    named.update(kwargs)
    inp, off = named["input"], named.get("offsets")
    m = c.module
    if inp.dim() == 2:
        rows = torch.randint(inp.shape[0], (batch,), generator=gen).to(inp.device)
        x = inp[rows]
        return (lambda: m(x)), x.numel(), inp.shape[1]
    pool = max(1, round(inp.numel() / max(1, off.numel())))
    pick = torch.randint(inp.numel(), (batch * pool,), generator=gen).to(inp.device)
    x = inp[pick]
    o = torch.arange(0, batch * pool, pool, device=inp.device, dtype=off.dtype)
    return (lambda: m(x, o)), x.numel(), pool


def _rows(x: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` rows of ``x`` drawn with replacement."""
    return x[torch.randint(x.shape[0], (batch,), generator=gen).to(x.device)]


@dataclass(frozen=True)
class _Setup:
    """What every estimate shares: the card, the table format, the MLP's reuse factor, the timing budget."""

    card: Card
    fmt: str
    reuse_factor: int
    repeats: int
    budget_s: float


def _row_bytes(dim: int, fmt: str) -> int:
    """Bytes of one table row on the card (int8 row-wise rows carry a float scale and bias)."""
    return max(1, dim * _fmt_bits(fmt) // 8) + (8 if fmt == "int8_rowwise" else 0)


def _estimate(c: Candidate, args: tuple, kwargs: dict, batch: int, setup: _Setup, gen: torch.Generator,
              rtl: Any = None) -> tuple[float, dict[str, Prediction], str]:
    """One candidate at one batch size: (measured host seconds, card prediction per launch mode, host device)."""
    m = c.module
    card = setup.card
    dev = _device_of(m) if not c.functional else m.weight.device
    if c.kind == "embedding_bag":
        call, lookups, _ = _bag_inputs(c, args, kwargs, batch, gen)
        dim = m.embedding_dim
        pred = {mode: predict_lookup(card, [lookups], [_row_bytes(dim, setup.fmt)], batch, dims=[dim], rows_per_table=[m.num_embeddings],
                                     launch=mode) for mode in LAUNCHES}
    elif c.kind == "embedding":
        x = _rows(args[0], batch, gen)
        call = lambda: m(x)  # noqa: E731
        dim = m.embedding_dim
        pred = {mode: predict_lookup(card, [x.numel()], [_row_bytes(dim, setup.fmt)], x.numel(), dims=[dim],
                                     rows_per_table=[m.num_embeddings], launch=mode) for mode in LAUNCHES}
    else:
        x = _rows(args[0], batch, gen)
        call = lambda: m(x)  # noqa: E731
        lin = [l for l in m if isinstance(l, nn.Linear)]
        sizes = [lin[0].in_features] + [l.out_features for l in lin]
        if rtl is not None:  # measured: Verilator cycles and Yosys counts of MLP.to_rtl
            pred = {mode: predict_mlp(card, sizes, batch, rtl_cycles=rtl.latency_cycles, rtl_resources=rtl.resources, launch=mode)
                    for mode in LAUNCHES}
        else:
            pred = {mode: predict_mlp(card, sizes, batch, reuse_factor=setup.reuse_factor, launch=mode) for mode in LAUNCHES}
    host = _median_time(call, dev, setup.repeats, setup.budget_s)
    return host, pred, str(dev)


def _fits(card: Card, res: dict[str, float]) -> tuple[bool, str]:
    """Whether ``res`` fits the card's budget, and what goes over it."""
    over = []
    for key, cap in (("DSP", card.dsp), ("BRAM36", card.bram36), ("URAM", card.uram), ("LUT", card.lut), ("HBM_bytes", card.memory_bytes)):
        if res.get(key, 0) > cap:
            over.append(f"{key} {res[key]:.0f} > {cap}")
    return not over, "; ".join(over)


def _pick(preds: Mapping[str, Prediction], launch: str) -> str:
    """The launch mode a row's verdict uses: the one asked for, or under ``auto`` the faster one
    (the first of :data:`LAUNCHES` on a tie)."""
    return min(preds, key=lambda mode: preds[mode].total_s) if launch == AUTO else launch


def _row(name: str, kind: str, shape: str, batch: int, dev: str, host: float, preds: Mapping[str, Prediction], card: Card,
         launch: str) -> Estimate:
    """The estimate and its verdict: ``offload`` when it fits and the card is faster in the chosen
    launch mode, else ``keep``."""
    mode = _pick(preds, launch)
    pred = preds[mode]
    ok, over = _fits(card, pred.resources)
    card_s = pred.total_s
    tag = "modelled " if mode == "persistent" else ""
    if not ok:
        verdict, why = "keep", f"does not fit {card.name}: {over}"
    elif card_s < host:
        verdict, why = "offload", f"{mode}: {tag}card {_us(card_s)} < host {_us(host)} ({host / card_s:.1f}x)"
    else:
        verdict, why = "keep", f"{mode}: host {_us(host)} <= {tag}card {_us(card_s)} ({card_s / host:.1f}x slower on the card)"
    modes = {m: {"transfer_s": p.transfer_s, "launch_s": p.launch_s, "kernel_s": p.kernel_s, "card_s": p.total_s} for m, p in preds.items()}
    return Estimate(name, kind, shape, batch, dev, host, pred.transfer_s, pred.launch_s, pred.kernel_s,
                    {k: float(pred.resources.get(k, 0)) for k in _RES_KEYS}, ok, verdict, why, mode, modes)


def _check_arguments(card: str | Card, batch_sizes: Sequence[int], fmt: str, launch: object) -> tuple[Card, tuple[int, ...]]:
    """The card, the batch sizes as positive ints, a table format the model knows (else ValueError)
    and a launch mode (else InputError / InputTypeError naming ``launch``)."""
    check_launch(launch, extra=(AUTO,))
    cardv = get_card(card)
    sizes = tuple(int(b) for b in batch_sizes)
    if not sizes or any(b < 1 for b in sizes):
        raise ValueError(f"batch_sizes: expected positive integers, got {list(batch_sizes)}")
    _fmt_bits(fmt)
    return cardv, sizes


def _launch_notes(card: Card, launch: str) -> list[str]:
    """What each launch mode's parts are, where their constants come from, and which one the verdicts use."""
    lo, hi = KERNEL_LAUNCH_REPORTED_S
    use = "the faster mode at each batch size" if launch == AUTO else f"{launch} only"
    ring = ring_memory(card)
    if ring.host:
        parts = (f"xfer = one host-card round trip ({_us(HOST_CARD_ROUND_TRIP_S)}, measured on Coyote's shell, "
                 f"fpgasystems/Coyote issue #161) plus bytes over PCIe, poll = the kernel loop's poll interval "
                 f"({_us(PERSISTENT_POLL_INTERVAL_S)}, an assumption)")
    else:
        parts = (f"xfer = {CARD_RING_SYNCS} buffer syncs ({_us(PCIE_TRANSFER_LATENCY_S)} each, assumed) plus bytes over PCIe, "
                 f"poll = one card-memory read ({_us(card.memory.random_read_latency_s)}, assumed)")
    return [
        f"per-call: each buffer synced ({_us(PCIE_TRANSFER_LATENCY_S)} each, assumed) plus bytes over PCIe, and one xrt::run "
        f"({_us(KERNEL_LAUNCH_S)}; users report {lo * 1e6:.0f}-{hi * 1e6:.0f} us: Xilinx/XRT issues #6601, #8687): "
        "the host path offload runs today",
        f"persistent figures are MODELLED, not measured on a card: the kernel is started once and serves a ring of request "
        f"slots ({ring.why}); {parts}",
        f"verdicts use {use} (launch={launch!r})",
    ]


def _record_inputs(gm: fx.GraphModule, cands: list[Candidate], args: tuple) -> dict[str, tuple[tuple, dict]]:
    """What each candidate receives on the example inputs (by its first node's name); a candidate
    the example never reaches has no entry."""
    rec = _InputRecorder(gm, {c.first.name: c for c in cands})
    with torch.inference_mode():
        rec.run(*args)
    return rec.inputs


def _rtl_notes(cands: list[Candidate], rtl: Mapping[str, Any]) -> list[str]:
    """One note per measured RTL summary; ValueError for one that names no MLP candidate or has no cycles."""
    notes = []
    for c in cands:
        r = rtl.get(c.name)
        if r is not None:
            if c.kind != "mlp" or r.latency_cycles is None:
                raise ValueError(f"rtl[{c.name!r}]: needs an MLP candidate and a measured RTL summary (run predict() first)")
            res = "no Yosys counts" if r.resources is None else ", ".join(f"{k} {r.resources[k]}" for k in ("LUT", "FF", "CARRY", "DSP", "BRAM"))
            notes.append(f"{c.name}: kernel time from RTL, {r.latency_cycles} cycles measured under Verilator "
                         f"({r.latency_ns:.1f} ns at {r.clock_mhz:g} MHz); Yosys xcup: {res} (Yosys's mapping is not Vivado's)")
    unknown = set(rtl) - {c.name for c in cands}
    if unknown:
        raise ValueError(f"rtl: no MLP candidate named {sorted(unknown)}; candidates are {[c.name for c in cands]}")
    return notes


def _batched_groups(cands: list[Candidate], inputs: Mapping[str, Any]) -> dict[tuple, list[Candidate]]:
    """The bags ``offload.offload`` would put in one table-batched call: same dim and mode, plain bags,
    at least two of them; keyed by (dim, mode)."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in cands:
        if c.kind == "embedding_bag" and c.first.name in inputs and not c.per_sample_weights:
            groups.setdefault((c.module.embedding_dim, c.bag_mode), []).append(c)
    return {k: g for k, g in groups.items() if len(g) > 1}


def _estimates_at(batch: int, cands: list[Candidate], inputs: Mapping[str, tuple[tuple, dict]], groups: dict[tuple, list[Candidate]],
                  setup: _Setup, gen: torch.Generator, rtl: Mapping[str, Any], launch: str) -> list[Estimate]:
    """Every reached candidate at one batch size, then one row per batched group: one launch, tables
    in parallel channels on the card, while the host runs them one after the other."""
    rows = []
    acc: dict[tuple, dict[str, Any]] = {k: {"host": 0.0, "lookups": [], "rows": [], "nrows": []} for k in groups}
    for c in cands:
        if c.first.name not in inputs:
            continue
        a, kw = inputs[c.first.name]
        host, preds, dev = _estimate(c, a, kw, batch, setup, gen, rtl.get(c.name))
        rows.append(_row(c.name, c.kind, c.describe(), batch, dev, host, preds, setup.card, launch))
        key = (c.module.embedding_dim, c.bag_mode) if c.kind == "embedding_bag" else None
        if key in groups and c in groups[key]:
            g = acc[key]
            g["host"] += host
            g["lookups"].append(_bag_inputs(c, a, kw, batch, gen)[1])
            g["rows"].append(_row_bytes(c.module.embedding_dim, setup.fmt))
            g["nrows"].append(c.module.num_embeddings)
    for (dim, mode), g in acc.items():
        n = len(groups[(dim, mode)])
        preds = {lm: predict_lookup(setup.card, g["lookups"], g["rows"], batch, dims=[dim] * n, rows_per_table=g["nrows"], launch=lm)
                 for lm in LAUNCHES}
        label = f"all {n} tables (batched)" if len(groups) == 1 else f"{n} tables dim {dim} {mode} (batched)"
        rows.append(_row(label, "embedding_bag", ", ".join(c.name for c in groups[(dim, mode)]), batch, "sum of above",
                         g["host"], preds, setup.card, launch))
    return rows


def _together_note(rows: list[Estimate], card: Card, batch: int) -> str | None:
    """Whether everything the advisor says to offload at ``batch`` fits on the card together."""
    chosen = [r for r in rows if r.batch == batch and r.verdict == "offload" and "(batched)" not in r.name]
    if not chosen:
        return None
    total = {k: sum(r.resources[k] for r in chosen) for k in _RES_KEYS}
    ok, over = _fits(card, total)
    n = len(chosen)
    return (f"at batch {batch}, the {n} candidate{'s' if n != 1 else ''} to offload need{'' if n != 1 else 's'} together "
            + ", ".join(f"{k} {total[k]:.0f}" for k in _RES_KEYS) + ("" if ok else f": over the card's budget ({over})"))


def advise(
    model: nn.Module,
    example_inputs: Any,
    batch_sizes: Sequence[int] = (1, 64, 4096),
    card: str | Card = "u55c",
    ops: Sequence[str] = OPS,
    fmt: str = "ap_fixed<16,6>",
    reuse_factor: int = 1,
    repeats: int = 15,
    budget_s: float = 0.25,
    seed: int = 0,
    rtl: Mapping[str, Any] | None = None,
    launch: str = "per_call",
) -> Advice:
    """Measure each candidate on its device and predict it on ``card`` at every batch size.

    ``example_inputs`` are the forward's positional args; each candidate's inputs at batch size B
    are resampled (with replacement) from what it receives on them. Returns an :class:`Advice`.
    ``rtl`` maps an MLP candidate's name to the ``summary()`` of its ``MLP.to_rtl`` result (after
    ``predict``/``resources()``): its measured cycles and Yosys counts replace the model's.
    ``launch`` picks the launch mode the verdicts use: ``"per_call"`` (one ``xrt::run`` a call, the
    host path that exists today), ``"persistent"`` (a running kernel polling request slots in host
    memory: modelled, not measured) or ``"auto"`` (the faster at each batch size). Every row holds
    both modes' figures either way.

    Example::

        print(offload.advise(model, (idx, off, dense), batch_sizes=(1, 4096), card="u280", launch="auto"))
    """
    cardv, sizes = _check_arguments(card, batch_sizes, fmt, launch)
    advice = Advice(cardv, sizes, launch=launch)
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    try:
        gm = trace(model)
    except Exception as e:  # noqa: BLE001 - FX raises many types
        advice.notes.append(f"model not traceable by torch.fx ({type(e).__name__}): nothing to advise")
        return advice
    cands, skipped = find_candidates(gm, tuple(ops))
    advice.notes.extend(f"{s.node.name}: {s.reason}" for s in skipped)
    inputs = _record_inputs(gm, cands, args)
    rtl = dict(rtl or {})
    advice.notes.extend(_rtl_notes(cands, rtl))
    advice.notes.extend(_launch_notes(cardv, launch))
    groups = _batched_groups(cands, inputs)
    setup = _Setup(cardv, fmt, reuse_factor, repeats, budget_s)
    gen = torch.Generator().manual_seed(seed)
    for b in sizes:
        advice.rows.extend(_estimates_at(b, cands, inputs, groups, setup, gen, rtl, launch))
    # Everything the advisor says to offload at the largest batch has to fit on the card together.
    note = _together_note(advice.rows, cardv, max(sizes))
    if note is not None:
        advice.notes.append(note)
    return advice
