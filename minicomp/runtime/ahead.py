"""Compiling a kernel ahead of its first call, in compile_pool.py's threads.

A module compiled in this process starts its kernels' Triton compiles before
their first call: one task per configuration the first call may choose
(tuning.py `configs`), each loading the binary a record names (records.py) or
compiling it through Triton's JIT (`warmup`), then loading it onto the GPU. The
compile itself runs in a worker process where one is free (compile_processes.py):
Triton's frontend holds the GIL, so threads alone take turns there; `warmup`
then finds the worker's binary in Triton's cache.
Pointers are assumed 16-byte aligned, as fresh allocations are; a first call
where one is not compiles as before.
"""

from __future__ import annotations

import concurrent.futures

import torch

from minicomp import logs
from minicomp.runtime import compile_pool, compile_processes, tuning
from minicomp.runtime.records import specializations

Config = tuning.Config


class Ahead:
    """One kernel's compiles ahead: their binaries and what those assumed of the arguments."""

    def __init__(self):
        self.binaries: dict[Config, tuple] = {}  # config -> (compiled kernel, through the JIT)
        self.tasks: list[concurrent.futures.Future] = []
        self.aligned: set[int] = set()  # the pointers the binaries assume 16-byte aligned
        self.specializations: list[str] = []  # and the arguments' specializations they were compiled for
        self.configs: list[Config] = []  # what `start` found the first call may choose
        self.target = None  # Triton's GPUTarget of the launch's device
        self.workers = None  # the compile processes (compile_processes.py), if any

    @property
    def compiles(self) -> int:
        """Binaries Triton's JIT compiled ahead (every configuration tried)."""
        return sum(1 for _, through_jit in list(self.binaries.values()) if through_jit)

    def start(self, launch, signature: list) -> None:
        """Start compiling `launch`'s kernel for a call with `signature` (each argument's
        torch.dtype for a tensor, the int itself for an integer) in `compile_pool.pool()`.
        Settings are read here, in the caller's thread."""
        index = launch.device.index or 0
        try:
            configs = tuning.configs(launch.spec, launch.device, launch.records)
            compile_pool.triton_started(index)  # its driver is made once, not by two threads
            launch.kernel.device_caches[index]  # made once here: the tasks share Triton's JIT cache
            found = specializations(signature, launch.unspecialized)
            pool = compile_pool.pool()
        except Exception as err:  # noqa: BLE001 - nothing ahead: the first call compiles, as without it
            logs.cache.info("%s: not compiled ahead (%s: %s)", launch.name, type(err).__name__, err)
            return
        self.configs, self.specializations = configs, found
        self.aligned = {i for i, v in enumerate(signature) if isinstance(v, torch.dtype)}
        self.target = _target(index)
        self.workers = compile_processes.workers()
        if self.workers is not None:
            self.workers.expect(len(configs))
        self.tasks = [pool.submit(self._compile, launch, c, signature) for c in configs]

    def _compile(self, launch, config: Config, signature: list) -> None:
        """One task of `start` (in a pool thread): a failure is only logged, and the first call
        compiles that configuration itself, where the error reaches the user's fallback policy."""
        try:
            with torch.cuda.device(launch.device):
                path = launch.records.binary_path(config, self.specializations)
                compiled, through_jit = launch.records.restore(path, self.aligned), False
                if compiled is None:
                    settings = launch.settings(*config)
                    compile_processes.compile_in_worker(launch.kernel, signature, settings, self.target)
                    compiled = launch.kernel.warmup(*signature, grid=(1,), **settings)
                    compiled._init_handles()  # its launcher built and the binary loaded, here too
                    through_jit = True
                    launch.records.remember(compiled, path, self.aligned)
                self.binaries[config] = (compiled, through_jit)
        except Exception as err:  # noqa: BLE001 - the first call compiles it and reports
            logs.cache.info("%s: compile ahead of %s failed (%s: %s)", launch.name, config, type(err).__name__, err)
        finally:
            if self.workers is not None:
                self.workers.finished()

    def wait(self) -> None:
        concurrent.futures.wait(self.tasks)

    def binary(self, config: Config, aligned: set[int], found: list[str]) -> tuple | None:
        """(compiled, through the JIT) at `config`, if compiled ahead for arguments like these."""
        if aligned == self.aligned and found == self.specializations:
            return self.binaries.get(config)
        return None


def _target(index: int):
    """Triton's GPUTarget of CUDA device `index` (what a worker process compiles for), or None
    (no worker then: the threads compile)."""
    try:
        from triton.runtime.driver import driver

        with torch.cuda.device(index):
            return driver.active.get_current_target()
    except Exception as err:  # noqa: BLE001 - no target: compiled in this process
        logs.cache.info("no compile target for device %d (%s: %s)", index, type(err).__name__, err)
        return None
