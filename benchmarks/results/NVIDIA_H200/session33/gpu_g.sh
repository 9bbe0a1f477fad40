export PYTHONPATH=$PWD
MINICOMP_LOGS=fusion timeout 200 python .probe/s33/bert_graph.py > $OUT/bert_graph.txt 2>&1
