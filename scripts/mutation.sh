#!/usr/bin/env bash
# Mutation testing with cosmic-ray, one module at a time (configs in scripts/mutation/*.toml).
#   scripts/mutation.sh connectivity                       # every mutant of hls/connectivity.py
#   scripts/mutation.sh fixed --sample 40                  # a seeded sample of 40
#   scripts/mutation.sh ptq --lines 200-459 --sample 20    # only mutants on those lines
# A session lives in .mutation/<name>.sqlite and resumes where it stopped; delete it to start over.
# cosmic-ray mutates the module in place (the editable install must see the mutant, see TESTING.md),
# so run one session at a time and never while editing that module.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/mutation.sh MODULE [--lines A-B] [--sample N] [--seed S]}
shift
cfg=scripts/mutation/$name.toml
[ -f "$cfg" ] || { echo "no config $cfg; modules: $(ls scripts/mutation | sed 's/\.toml//' | tr '\n' ' ')"; exit 2; }
BIN=${VENV:-.venv}/bin
export PATH="$PWD/$BIN:$PATH"   # the test-command's `python` is the venv's
module=$(sed -n 's/^module-path = "\(.*\)"/\1/p' "$cfg")
git diff --quiet -- "$module" || { echo "$module has uncommitted changes; commit or stash them first"; exit 2; }
mkdir -p .mutation
db=.mutation/$name.sqlite
if [ ! -f "$db" ]; then
    cosmic-ray init "$cfg" "$db"
    [ $# -eq 0 ] || python scripts/mutation_select.py "$db" "$@"
fi
cosmic-ray baseline "$cfg"
cosmic-ray exec "$cfg" "$db"
# A mutant left on disk by a killed run would poison everything after it.
git diff --quiet -- "$module" || { echo "WARNING: $module differs from git after the run; restore it with git checkout"; exit 1; }
python scripts/mutation_score.py "$db"
