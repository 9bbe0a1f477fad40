"""Binding a compiled kernel to its launch: a function that hands the arguments straight to
Triton's C launcher, with no argument binding, specialization key or cache lookup.

That is safe because a generated module serves exactly one input signature
(shapes, strides, dtypes: the caller's guard checked them); the one property
Triton also specializes on that the guard does not cover, 16-byte alignment of
each pointer, is checked per call (a misaligned view goes through Triton's JIT).
"""

from __future__ import annotations

import torch


def aligned_positions(args) -> set[int]:
    """Positions of tensor arguments whose data is 16-byte aligned (Triton specializes on it)."""
    return {i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.data_ptr() % 16 == 0}


def bind(compiled, grid: int, block: int, device_index: int, aligned: set[int], fallback):
    """A function that launches `compiled` on the current stream, arguments as given.

    `compiled` assumed the pointers at `aligned` are 16-byte aligned; a call
    where one is not (a view at an odd offset) goes through `fallback` (Triton's JIT) instead.
    """
    launcher, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    current_stream = torch._C._cuda_getCurrentRawStream
    current_device = torch._C._cuda_getDevice
    check = tuple(sorted(aligned))
    if getattr(launcher, "global_scratch_size", 1) == 0 and getattr(launcher, "profile_scratch_size", 1) == 0:
        # no scratch memory to allocate per launch: call the C launcher under Triton's Python wrapper
        c_launch, cooperative, pdl = launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl

        def launch(stream, args):
            c_launch(
                grid, 1, 1, stream, function, cooperative, pdl, None, None, metadata, None, None, None, *args, block
            )
    else:

        def launch(stream, args):
            launcher(grid, 1, 1, stream, function, metadata, None, None, None, *args, block)

    def fast(*args):
        if current_device() != device_index:  # launches go to the current device's context
            with torch.cuda.device(device_index):
                return fast(*args)
        for i in check:
            if args[i].data_ptr() % 16:
                return fallback(args)
        return launch(current_stream(device_index), args)

    return fast
