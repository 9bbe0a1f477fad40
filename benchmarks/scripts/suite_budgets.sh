#!/usr/bin/env bash
# The model suite's steps at several config "chunk_budget_bytes" (issue #41), side by side on one machine:
# Inductor once, then minicomp from a copy of this tree per budget (config's default edited in the copy).
# Usage (repository root, GPU machine):  OUT=DIR MODELS=llama,gpt2,bert BUDGETS="0 128 256" bash benchmarks/scripts/suite_budgets.sh
#   BUDGETS in MiB; STEPS (default train) and SUITE_TIMEOUT (default 100) as the suite reads them.
set -uo pipefail
OUT=${OUT:-/tmp/minicomp-gpu}
mkdir -p "$OUT"
export SUITE_TIMEOUT=${SUITE_TIMEOUT:-100} STEPS=${STEPS:-train}
VARIANTS=inductor PYTHONPATH=. python -m minicomp.bench.models "$OUT/budget_inductor.json" 2>&1 | grep "^{" | cut -c1-600
for b in ${BUDGETS:-0 128 256}; do
  tree=$(mktemp -d)
  cp -r minicomp templates benchmarks pyproject.toml "$tree/"
  sed -i "s/chunk_budget_bytes=0,/chunk_budget_bytes=$b << 20,/" "$tree/minicomp/config.py"
  (cd "$tree" && VARIANTS=minicomp PYTHONPATH=. python -m minicomp.bench.models "$OUT/budget_$b.json" 2>&1 | grep "^{" | cut -c1-600)
  rm -rf "$tree"
done
