#!/bin/bash
# Session 32: the steady state with the probe size on and off (probe_steady.py), alternating
# processes, two rounds a model; then new_lengths.py for the probe's own seconds (gpt2, llama).
START=$(date +%s)
for round in 1 2; do
  for m in gpt2 llama; do
    for p in on off; do
      [ $(( $(date +%s) - START )) -gt 380 ] && break 3
      timeout 90 python benchmarks/scripts/probe_steady.py $m $p 2>/dev/null | grep '^{' >> $OUT/steady.jsonl
    done
  done
done
for m in gpt2 llama; do
  [ $(( $(date +%s) - START )) -gt 480 ] && break
  timeout 60 python benchmarks/scripts/new_lengths.py $m minicomp 1024 1023 1022 1021 2>/dev/null | grep "^$m " >> $OUT/probe_cost.txt
done
cat $OUT/steady.jsonl; cut -c1-100 $OUT/probe_cost.txt; grep -o '"probe[^,]*' $OUT/probe_cost.txt
