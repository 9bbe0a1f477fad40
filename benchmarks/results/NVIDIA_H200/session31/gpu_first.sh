#!/bin/bash
# Cold first steps (every cache fresh, a process each), trees alternating: old (HEAD), new (working
# tree), nogc (new with config pause_gc off); ROWS as "model:step"; INDUCTOR=1 adds Inductor's row.
ROOT=$PWD
START=$(date +%s)
LIMIT=${LIMIT:-530}
for row in ${ROWS:-gpt2:train bert:train bert:infer dlrm:train}; do
  m=${row%%:*}; s=${row##*:}
  for tree in ${TREES:-old new nogc}; do
    [ $(( $(date +%s) - START )) -gt $LIMIT ] && { echo "time limit: stop" >> $OUT/first_calls.log; break 2; }
    dir=$([ $tree = new ] && echo $ROOT || echo $ROOT/.probe/$tree)
    line=$(cd $dir && PYTHONPATH=$dir timeout 120 python benchmarks/scripts/first_call_split.py $m $s minicomp 2>>$OUT/first_calls.log | grep '^SPLIT')
    echo "{\"tree\": \"$tree\", \"split\": ${line#SPLIT }}" >> $OUT/first_calls.jsonl
  done
  if [ "$INDUCTOR" = 1 ]; then
    line=$(cd $ROOT && PYTHONPATH=$ROOT timeout 120 python benchmarks/scripts/first_call_split.py $m $s inductor 2>>$OUT/first_calls.log | grep '^SPLIT')
    echo "{\"tree\": \"inductor\", \"split\": ${line#SPLIT }}" >> $OUT/first_calls.jsonl
  fi
done
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
