"""Demo section: offload a DLRM's embedding tables with ``offload.offload``, check the numbers, ask the advisor.

``partition_demo_section(console) -> bool`` follows :mod:`offload.demo`'s section contract (False:
a check failed). Small tables by default (seconds); ``OFFLOAD_DEMO_FULL=1`` runs the full-size
model (10^4..10^6-row tables at dim 32).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Iterator

import torch
from rich import box
from rich.console import Console
from rich.table import Table

import offload
from offload.examples.dlrm import run, run_torchrec

__all__ = ["partition_demo_section"]

_LSB = 2.0**-10  # ap_fixed<16,6>


def partition_demo_section(console: Console | None = None, full: bool | None = None) -> bool:
    """Train a DLRM, offload its 8 tables (one table-batched call on the sim device), compare, advise."""

    console = console or Console()
    full = os.environ.get("OFFLOAD_DEMO_FULL") == "1" if full is None else full
    console.rule(f"[bold]Partitioning: a DLRM's embedding tables offloaded ({'full size' if full else 'small tables'})")
    res = run(small=not full, steps=None if not full else 60, n_eval=4096)
    console.print(res.report.table())

    # Per-table check: every pooled value within (longest bag) LSBs of float (entries truncated to
    # ap_fixed<16,6>, sums exact), plus the float32 reference's rounding.
    ok = all(d.offloaded for d in res.report.decisions) and len(res.report.batches) == 1
    local = {d.name: d for d in res.comparison.local}
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("table", "rows", "cosine", "max |err|", "bound"):
        t.add_column(col, justify="right")
    for i, (idx, off) in enumerate(zip(res.test_data.indices, res.test_data.offsets)):
        longest = int(torch.diff(torch.cat([off, off.new_tensor([len(idx)])])).max())
        bound = longest * _LSB + longest * 4 * 2.0**-24
        d = local[f"offload_tables_0[{i}]"]
        ok &= d.max_abs_err <= bound
        t.add_row(f"tables.{i}", str(res.model.tables[i].num_embeddings), f"{d.cosine:.6f}", f"{d.max_abs_err:.2e}", f"{bound:.2e}")
    console.print(t)
    auc_ok = res.auc_offload >= res.auc_float - 0.01
    ok &= auc_ok
    colour = "green" if ok else "red"
    console.print(f"[{colour}]{res.summary()}[/]")

    adv = offload.advise(res.model, res.test_data.batches(512)[0].inputs, batch_sizes=(1, 64, 4096), card="u55c",
                         ops=("embedding_bag", "mlp"), repeats=7, budget_s=0.1)
    a = Table(title="offload advise (u55c): measured host vs predicted card", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("candidate", "batch", "host", "card (xfer+launch+kernel)", "verdict"):
        a.add_column(col)
    for r in adv.rows:
        if r.name.startswith("tables_"):
            continue  # the batched row stands for them
        a.add_row(r.name, str(r.batch), f"{r.host_s * 1e6:.0f} us", f"{r.card_s * 1e6:.0f} us ({r.transfer_s * 1e6:.0f}+{r.launch_s * 1e6:.0f}+{r.kernel_s * 1e6:.0f})", r.verdict)
    console.print(a)
    if importlib.util.find_spec("torchrec") is not None:  # the optional `torchrec` extra
        ok &= _torchrec_variant(console, res)
    return bool(ok)


_TORCH_FX_TRACING_NOTICE = "is_fx_tracing will return true for both fx.symbolic_trace and torch.export"


@contextlib.contextmanager
def _without_torch_fx_tracing_notice() -> Iterator[None]:
    """Drop torch's ``is_fx_tracing`` notice, and only it, while the block runs.

    torch 2.13's ``ProxyableClassMeta.__call__`` (the metaclass of torchrec's JaggedTensor,
    KeyedJaggedTensor and KeyedTensor) calls torch's own deprecated ``is_fx_tracing()``, which logs
    a notice meant for that function's callers, once a process, on the logger
    ``torch.fx._symbolic_trace``. The first KJT or KeyedTensor built, by this demo or inside
    torchrec's own EmbeddingBagCollection, sets it off: no call of offload's can be changed to
    avoid it, and the demo's reader can do nothing about it.
    """
    logger = logging.getLogger("torch.fx._symbolic_trace")

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_TORCH_FX_TRACING_NOTICE)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _torchrec_variant(console: Console, res) -> bool:
    """The same trained DLRM written with TorchRec (EBC over a KeyedJaggedTensor, torchrec's MLP)."""
    with _without_torch_fx_tracing_notice():
        return _torchrec_checks(console, res)


def _torchrec_checks(console: Console, res) -> bool:
    console.rule("[bold]The same DLRM, TorchRec style: EmbeddingBagCollection + torchrec MLP")
    # Tables only, like the section above (its MLPs stay on the host too); with ops=("embedding_bag", "mlp")
    # torchrec's MLP and the functional-activation top become two MLP chains (tests/partition/test_torchrec_partition.py).
    tr = run_torchrec(trained=(res.model, res.test_data), ops=("embedding_bag",))
    console.print(tr.report.table())
    rows = {d.node: d for d in tr.report.decisions}
    calls = len(tr.offloaded.get_submodule(rows["ebc"].replacement).tbes)
    ok = calls == 1 and all(d.offloaded for d in tr.report.decisions) and tr.auc_offload >= tr.auc_float - 0.01
    colour = "green" if ok else "red"
    console.print(f"[{colour}]TorchRec DLRM: EBC ({rows['ebc'].shape}) in {calls} table-batched call; "
                  f"output cosine {tr.comparison.min_cosine:.6f}; AUC float {tr.auc_float:.4f} -> offloaded {tr.auc_offload:.4f}[/]")
    return bool(ok)
