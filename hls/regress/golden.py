"""Golden vectors in a regression run: selecting catalogue entries, telling stale vectors from
a catalogue that still builds the same kernel, and regenerating them from the fixed seeds.

Example::

    from offload.hls.regress.golden import describe_change, regenerate
    for name, diff in regenerate("emb/sum/*").items():
        print(name, describe_change(diff))
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from offload.hls.regress.report import Check, compare_outputs
from offload.kernels.catalogue import Entry, Golden, GoldenError, diff_golden, golden_dir, load_golden, read_index, write_golden
from offload.kernels.catalogue import entries as catalogue_entries
from offload.kernels.registry import get_kind

__all__ = ["select", "patterns_of", "stale_check", "regenerate", "describe_change"]


def select(selection: Iterable[Entry] | Iterable[str] | str | None) -> list[Entry]:
    """Catalogue entries from patterns, a pattern, entries themselves, or ``None`` (all)."""
    if selection is None or isinstance(selection, str):
        return catalogue_entries(selection)
    items = list(selection)
    if all(isinstance(x, Entry) for x in items):
        return items
    return catalogue_entries([str(x) for x in items])


def patterns_of(selection: Any) -> list[str]:
    """What a selection asked for, for the report's settings (at most 20 names)."""
    if selection is None:
        return []
    if isinstance(selection, str):
        return [selection]
    return [x if isinstance(x, str) else x.name for x in selection][:20]


def stale_check(entry: Entry, golden: Golden) -> Check:
    """``pass`` when the catalogue still builds the kernel and inputs ``golden`` was made for, else what differs."""
    case = entry.build()
    fresh = Golden(entry.name, entry.kind, entry.seed, case.kernel.spec.to_json(), case.kernel.tensors, case.inputs, golden.outputs)
    diff = diff_golden(golden, fresh)
    if diff:
        what = ", ".join(f"{k}: {v}" for k, v in diff.items())
        return Check("fail", f"golden vectors are stale ({what}); regenerate with `offload regress --regenerate --kernel '{entry.name}'`", {"diff": diff})
    return Check("pass", "catalogue builds the kernel the golden vectors were made for")


def regenerate(selection: Iterable[Entry] | Iterable[str] | str | None = None, *, device: Any = None, root: Path | None = None,
               jobs: int = 1, prune: bool | None = None, reason: str | None = None) -> dict[str, dict[str, Any]]:
    """Rebuild golden vectors from the catalogue (fixed seeds) and write those that changed.

    Vectors whose kernel and inputs are unchanged but whose expected outputs differ mean the
    reference itself computes something else now: that is exactly what golden vectors exist to
    catch, so such an entry is refused (``{"refused": ...}`` plus the diff, nothing written) unless
    ``reason`` says why the new outputs are right. Changes that follow a catalogue change (spec,
    tensors or inputs differ, new or removed entries) are written.

    Expected outputs come from the reference model; with a ``device`` the C-simulation must agree
    bit for bit or the entry is not written (``{"error": ...}``). Returns entry name -> change
    (:func:`offload.kernels.catalogue.diff_golden`; empty when unchanged, ``{"removed": True}`` for
    pruned entries). ``prune`` (default: when the whole catalogue is selected) drops index entries
    no longer in the catalogue.
    """
    sel = select(selection)
    root = root or golden_dir()
    prune = (selection is None) if prune is None else prune

    def one(e: Entry) -> tuple[Entry, Golden | None, dict[str, Any]]:
        try:
            return _regenerate_one(e)
        except Exception as ex:  # noqa: BLE001 - reported against the entry; the others still regenerate
            return e, None, {"error": f"{type(ex).__name__}: {ex}"}

    def _regenerate_one(e: Entry) -> tuple[Entry, Golden | None, dict[str, Any]]:
        case = e.build()
        k = case.kernel
        kind = get_kind(k.kind)
        kind.validate(k.spec, k.tensors, case.inputs)
        outs = {n: np.asarray(v) for n, v in kind.reference(k.spec, k.tensors, case.inputs).items()}
        new = Golden(e.name, e.kind, e.seed, k.spec.to_json(), {n: np.asarray(v) for n, v in k.tensors.items()},
                     {n: np.asarray(v) for n, v in case.inputs.items()}, outs)
        if device is not None:
            chk = compare_outputs(device.run(device.load(new.kernel()), new.inputs), outs)
            if chk.status != "pass":
                return e, None, {"error": f"C-simulation disagrees with the reference, not written: {chk.detail}"}
        try:
            old = load_golden(e.name, root)
        except GoldenError:
            old = None
        diff = diff_golden(old, new)
        if diff and not reason and all(k.startswith("outputs.") for k in diff):
            return e, None, {"refused": "the reference's outputs changed for the same kernel and inputs; "
                                        "rerun with a reason (--reason) if the new outputs are right", **diff}
        return e, new, diff

    changes: dict[str, dict[str, Any]] = {}
    to_write: list[Golden] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for e, new, diff in pool.map(one, sel):
            changes[e.name] = diff
            if new is not None and diff:
                to_write.append(new)
    removed: list[str] = []
    if prune:
        names = {e.name for e in sel}
        removed = [n for n in read_index(root) if n not in names]
        for n in removed:
            changes[n] = {"removed": True}
    if to_write or removed:
        write_golden(to_write, root, remove=removed)
    return changes


def describe_change(diff: Mapping[str, Any]) -> str:
    """One line for a :func:`regenerate` change."""
    if not diff:
        return "unchanged"
    if diff.get("new"):
        return "new"
    if diff.get("removed"):
        return "removed (no longer in the catalogue)"
    if "error" in diff:
        return f"ERROR: {diff['error']}"
    if "refused" in diff:
        counts = "; ".join(f"{k}: {v} values differ" for k, v in diff.items() if k != "refused")
        return f"REFUSED ({counts}): {diff['refused']}"
    parts = []
    for k, v in diff.items():
        parts.append(f"{k} {v}" if isinstance(v, str) else f"{k}: {v} values differ")
    return "; ".join(parts)
