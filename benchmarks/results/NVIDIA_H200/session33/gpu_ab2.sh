export PYTHONPATH=$PWD
timeout 200 python benchmarks/scripts/memory_ab.py bert inductor minicomp > $OUT/bert_new2.txt 2>&1
(cd .probe/old && PYTHONPATH=$PWD timeout 150 python benchmarks/scripts/memory_ab.py bert inductor minicomp > $OUT/bert_old2.txt 2>&1)
timeout 120 python -m pytest -q -p no:cacheprovider tests/e2e/test_expanding_products.py > $OUT/gpu_tests.txt 2>&1
