#!/usr/bin/env bash
# A/B on one GPU lease: the same gpu_bench.sh parts (or the CUDA tests) on this tree and on another,
# in turn, tables side by side. The other tree is either an older commit or this tree with one edit:
#   REF=<commit>  bash benchmarks/scripts/gpu_ab.sh PART...   other tree: prev_tree/, made here from
#                 `git archive REF` (or carried to the GPU machine ready-made when it has no git)
#   EDIT='s/num_stages=2/num_stages=3/' FILE=minicomp/codegen/reduction.py \
#                 bash benchmarks/scripts/gpu_ab.sh norms bias   other tree: a copy of this one, FILE edited
# PART: any gpu_bench.sh part (an experiment by name too), or `tests` (this tree's CUDA tests against the
# other tree's package: does a new regression test catch the old code?). ROUNDS=3 repeats the pair.
# Each tree's results go to $OUT/new/ and $OUT/prev/.
set -uo pipefail
OUT=${OUT:-/tmp/minicomp-ab}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -n "${EDIT:-}" ]; then
    PREV=$(mktemp -d)/variant
    mkdir -p "$PREV" && cp -r minicomp templates "$PREV/"
    sed -i "$EDIT" "$PREV/$FILE"
    cmp -s "$FILE" "$PREV/$FILE" && { echo "gpu_ab.sh: EDIT changed nothing in $FILE" >&2; exit 1; }
else
    PREV=prev_tree
    if [ ! -d "$PREV/minicomp" ]; then
        [ -n "${REF:-}" ] || { echo "gpu_ab.sh: set REF=<commit> or EDIT=... FILE=... (or provide prev_tree/)" >&2; exit 2; }
        mkdir -p "$PREV"
        # shellcheck disable=SC2046
        git archive "$REF" minicomp $(git ls-tree --name-only "$REF" templates) | tar -x -C "$PREV"
    fi
fi
for round in $(seq "${ROUNDS:-1}"); do
    for tree in new prev; do
        dir=.; [ $tree = prev ] && dir=$PREV
        for part in "$@"; do
            echo "==== $tree (round $round): $part"
            if [ "$part" = tests ]; then
                TREE=$dir OUT=$OUT/$tree bash "$HERE/gpu_tests.sh"
            else
                TREE=$dir OUT=$OUT/$tree bash "$HERE/gpu_bench.sh" "$part"
            fi
        done
    done
done
