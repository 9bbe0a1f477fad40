export PYTHONPATH=.; export MINICOMP_CACHE_DIR=/tmp/wc/mc TRITON_CACHE_DIR=/tmp/wc/tr
python -m minicomp.bench.compile_probe minicomp cuda
python -m minicomp.bench.compile_probe minicomp cuda
python - <<'PY'
import cProfile, pstats, time, torch
from minicomp.workloads import bias_relu
x, b = torch.randn(1024, 1024, device="cuda"), torch.randn(1024, device="cuda")
import minicomp
fn = minicomp.jit(bias_relu)
pr = cProfile.Profile(); t = time.perf_counter(); pr.enable()
fn(x, b); torch.cuda.synchronize()
pr.disable(); print("first call", time.perf_counter() - t)
pstats.Stats(pr).sort_stats("cumtime").print_stats(28)
PY
