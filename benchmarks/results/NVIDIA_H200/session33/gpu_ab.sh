export PYTHONPATH=$PWD
timeout 280 python benchmarks/scripts/memory_ab.py bert inductor minicomp minicomp:recompute_for_memory=false > $OUT/bert_ab.txt 2>&1
(cd .probe/old && PYTHONPATH=$PWD timeout 150 python benchmarks/scripts/memory_ab.py bert inductor minicomp > $OUT/bert_old.txt 2>&1)
timeout 150 python benchmarks/scripts/peak_snapshot.py bert minicomp > $OUT/peak_bert_new.txt 2>&1
