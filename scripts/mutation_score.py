"""Score of a cosmic-ray session: killed / (killed + survived) over the mutants that ran; skipped
(not selected) and pending ones are counted apart, never as killed. --survivors prints each
survivor's diff, for TESTING.md.

    python scripts/mutation_score.py .mutation/connectivity.sqlite --survivors
"""

from __future__ import annotations

import argparse
from collections import Counter

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("session")
    ap.add_argument("--survivors", action="store_true")
    args = ap.parse_args()
    with use_db(args.session, WorkDB.Mode.open) as db:
        n_items = db.num_work_items
        counts: Counter[str] = Counter()
        survivors = []
        for item, res in db.completed_work_items:
            if res.worker_outcome == WorkerOutcome.SKIPPED:
                counts["skipped"] += 1
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
          f"incompetent {counts['incompetent']}, skipped {counts['skipped']}, pending {pending}, "
          + ", ".join(f"{k} {v}" for k, v in counts.items() if k.startswith("worker")))
    if args.survivors:
        for item, res in sorted(survivors, key=lambda s: s[0].mutations[0].start_pos):
            m = item.mutations[0]
            print(f"--- line {m.start_pos[0]} {m.operator_name} #{m.occurrence}")
            print(res.diff)


if __name__ == "__main__":
    main()
