#!/usr/bin/env bash
# The CUDA tests on the GPU machine: every test marked `gpu` (the `device` fixture's "cuda" case and
# the tests that need CUDA without it). Extra arguments go to pytest (files, -k, -x ...).
# Usage (repository root):  OUT=... bash benchmarks/scripts/gpu_tests.sh [PYTEST ARGS...]
#   e.g. bash benchmarks/scripts/gpu_tests.sh tests/e2e/test_reductions.py
# The whole suite on the GPU machine (CPU and CUDA cases):  PYTHONPATH=. python -m pytest
# TREE=DIR runs this tree's tests against the package in DIR (see gpu_ab.sh).
set -uo pipefail
OUT=${OUT:-/tmp/minicomp-gpu}
mkdir -p "$OUT"
PYTHONPATH=${TREE:-.}:. python -P -m pytest -q -m gpu "$@" 2>&1 | tail -15 | tee "$OUT/gpu_tests${TREE:+_$(basename "$TREE")}.txt"
