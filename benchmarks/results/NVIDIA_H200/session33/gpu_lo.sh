export PYTHONPATH=$PWD
timeout 200 python .probe/s33/llama_order.py > $OUT/llama_order.txt 2>&1
