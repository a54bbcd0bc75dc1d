"""Narrow a cosmic-ray session before ``exec``: mark as skipped every pending mutant outside the
given line ranges, then all but a seeded random sample of the rest. Skipped mutants are counted
by neither side of the score, so a sampled score is the killed share of the sample.

    python scripts/mutation_select.py .mutation/ptq.sqlite --lines 200-459 --sample 40 --seed 17

--retest-survivors forgets the survivors' results, so the next ``exec`` runs them again against
the tests as they are now (after adding tests that should kill them).
"""

from __future__ import annotations

import argparse
import random
import sqlite3

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult


def _ranges(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        a, b = part.split("-")
        out.append((int(a), int(b)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("session")
    ap.add_argument("--lines", type=_ranges, default=None, help="keep mutants starting on these lines, e.g. 200-459,12-30")
    ap.add_argument("--sample", type=int, default=None, help="keep this many of them, chosen with --seed")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--retest-survivors", action="store_true")
    args = ap.parse_args()
    if args.retest_survivors:
        # WorkDB has no call to forget a result; its work_results table is keyed by job_id.
        con = sqlite3.connect(args.session)
        with con:
            n = con.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'").rowcount
        con.close()
        print(f"{args.session}: {n} survivors pending again")
        return
    with use_db(args.session, WorkDB.Mode.open) as db:
        pending = sorted(db.pending_work_items, key=lambda w: w.job_id)
        keep = [w for w in pending
                if args.lines is None or any(a <= w.mutations[0].start_pos[0] <= b for a, b in args.lines)]
        if args.sample is not None and args.sample < len(keep):
            keep = random.Random(args.seed).sample(keep, args.sample)
        kept = {w.job_id for w in keep}
        skip = [w.job_id for w in pending if w.job_id not in kept]
        db.set_multiple_results(skip, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not selected by mutation_select.py"))
        print(f"{args.session}: {len(pending)} pending, {len(kept)} selected, {len(skip)} skipped")


if __name__ == "__main__":
    main()
