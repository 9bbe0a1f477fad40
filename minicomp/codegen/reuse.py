"""In-place buffer reuse: a kernel writes a store into the memory of a buffer it reads for the
last time, as Inductor's in-place buffer reuse does."""

from __future__ import annotations

from minicomp.codegen.kernel import KernelSource
from minicomp.codegen.pointwise import PointwiseSource
from minicomp.ir import TensorMeta
from minicomp.lowering.layout import extent, is_dense
from minicomp.plan.fusion import Plan
from minicomp.plan.storages import Storages


def reused_in_place(plan: Plan, storages: Storages, source: KernelSource, dying: list[str]) -> dict[str, str]:
    """Store -> a buffer the kernel reads for the last time whose memory it can write it into:
    the kernel's own intermediate (not an input, output or view of something), dense, of the
    store's dtype and large enough, and read only at the store's own address, so each element is
    read by the program that overwrites it, before it does (any shape: the addresses are what
    match). A backward's gradient of the MLP's hidden state goes into the matmul result it came
    from. Only a pointwise kernel reads at its stores' addresses (`PointwiseSource.aligned`)."""
    if not isinstance(source, PointwiseSource):
        return {}
    graph, reused, taken = plan.graph, {}, set()
    for name in source.kernel.stores:
        meta = graph[name].meta
        if name in storages.kept:  # an output is its own tensor, never a view of a dead intermediate
            continue
        for buffer in source.aligned.get(name, ()):
            other = graph[buffer].meta
            if (
                buffer in dying
                and buffer not in taken
                and storages.owns_memory(buffer)
                and buffer not in storages.inputs | storages.kept
                and isinstance(other, TensorMeta)
                and (other.dtype, other.device) == (meta.dtype, meta.device)
                and other.stride == plan.strides.get(buffer, other.stride)
                and is_dense(other.shape, other.stride)  # it is all its memory
                and extent(meta.shape, plan.strides[name]) <= other.numel
            ):
                reused[name] = buffer
                taken.add(buffer)
                break
    return reused
