"""Runtime: what a generated module imports and what loads it. Never the compiler.

launch.py          Launch: one kernel's configuration, compile and bound C launcher
launch_configs.py  the configurations a kernel is launched with and tuned over
loader.py          generated source -> a module in the cache directory, imported
cache.py           the cache directory: private, verified, only its own files
compile_pool.py    threads that compile kernels ahead of their first call
interpreter_math.py  libdevice spelled for Triton's interpreter (CPU tensors)
"""

from minicomp.runtime.launch import Launch
from minicomp.runtime.loader import forget_loaded, load, module_name, module_path, source_hash

__all__ = ["Launch", "forget_loaded", "load", "module_name", "module_path", "source_hash"]
