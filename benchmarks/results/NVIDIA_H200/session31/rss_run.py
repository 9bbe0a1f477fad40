"""Run a module as __main__ with the given argv; print the process's peak RSS (MiB) after it."""

import resource
import runpy
import sys

sys.argv = sys.argv[1:]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
finally:
    print("PEAK_RSS_MIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, flush=True)
