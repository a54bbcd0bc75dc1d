"""Score of a cosmic-ray session: killed / (killed + survived) over the mutants that ran; skipped
(not selected) and pending ones are counted apart, never as killed. --survivors prints each
survivor's diff, for TESTING.md.

Mutants inside annotations are reported apart and left out of the score when the module has
``from __future__ import annotations``: such annotations are never evaluated (PEP 563), so
``str | Card`` -> ``str * Card`` is an equivalent mutant by construction.

    python scripts/mutation_score.py .mutation/connectivity.sqlite --survivors
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from collections import Counter

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome


def _annotation_spans(module_path: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions of every annotation, from the committed file (the one on disk may be
    a mutant); none when annotations are evaluated."""
    tree = ast.parse(subprocess.run(["git", "show", f"HEAD:{module_path}"], capture_output=True, text=True, check=True).stdout)
    lazy = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
               for n in tree.body)
    if not lazy:
        return []
    spans = []
    for n in ast.walk(tree):
        notes = []
        if isinstance(n, ast.arg) and n.annotation is not None:
            notes.append(n.annotation)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns is not None:
            notes.append(n.returns)
        elif isinstance(n, ast.AnnAssign):
            notes.append(n.annotation)
        spans += [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)) for a in notes]
    return spans


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("session")
    ap.add_argument("--survivors", action="store_true")
    args = ap.parse_args()
    with use_db(args.session, WorkDB.Mode.open) as db:
        n_items = db.num_work_items
        counts: Counter[str] = Counter()
        survivors = []
        spans: dict[str, list] = {}
        for item, res in db.completed_work_items:
            m = item.mutations[0]
            path = str(m.module_path)
            if path not in spans:
                spans[path] = _annotation_spans(path)
            if res.worker_outcome == WorkerOutcome.SKIPPED:
                counts["skipped"] += 1
            elif any(a <= tuple(m.start_pos) < b for a, b in spans[path]):
                counts["annotation"] += 1
            elif res.worker_outcome != WorkerOutcome.NORMAL:
                counts[f"worker {res.worker_outcome.value}"] += 1  # timeouts and crashes: reported, not scored
            else:
                counts[res.test_outcome.value] += 1
                if res.test_outcome == TestOutcome.SURVIVED:
                    survivors.append((item, res))
    ran = counts["killed"] + counts["survived"]
    pending = n_items - sum(counts.values())
    score = f"{100 * counts['killed'] / ran:.1f}%" if ran else "n/a"
    print(f"{args.session}: {counts['killed']} killed / {ran} run = {score}; "
          f"incompetent {counts['incompetent']}, in annotations (equivalent) {counts['annotation']}, skipped {counts['skipped']}, pending {pending}, "
          + ", ".join(f"{k} {v}" for k, v in counts.items() if k.startswith("worker")))
    if args.survivors:
        for item, res in sorted(survivors, key=lambda s: s[0].mutations[0].start_pos):
            m = item.mutations[0]
            print(f"--- line {m.start_pos[0]} {m.operator_name} #{m.occurrence}")
            print(res.diff)


if __name__ == "__main__":
    main()
