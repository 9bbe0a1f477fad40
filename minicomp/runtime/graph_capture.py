"""The device side of CUDA graphs (runtime/graphs.py): a side stream and a memory pool per device,
the warm-up and the capture; `Graphs` takes a stand-in with the same methods for CPU tests."""

from __future__ import annotations

import contextlib

import torch


class CaptureRefused(Exception):
    """A call that cannot be captured (the reason is the message)."""


class CudaCapture:
    """torch.cuda's graphs: warm-up and capture on one side stream per device, and one memory pool
    per device that every capture through this object shares (a model's forward on the caller's
    thread, its backward on autograd's: torch.cuda.graph_pool_handle)."""

    def __init__(self):
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._pools: dict[int, tuple] = {}

    def device_of(self, tensors) -> int:
        devices = {t.device for t in tensors}
        if any(d.type != "cuda" for d in devices):
            raise CaptureRefused("a CPU tensor is among its inputs")
        if len(devices) > 1:
            raise CaptureRefused("its inputs are on several devices")
        return next(iter(devices)).index if devices else torch.cuda.current_device()

    def _stream(self, device: int) -> torch.cuda.Stream:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        return stream

    def warmup(self, run, args: list, device: int):
        """run(args) on the side stream (as torch.cuda.graph's warm-up must), ordered after the
        current stream's work and before its later work."""
        current, side = torch.cuda.current_stream(device), self._stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            outputs = run(args)
        current.wait_stream(side)
        return outputs

    def capture(self, run, args: list, device: int):
        """(graph, outputs): run(args) captured on the side stream into the pool."""
        if device not in self._pools:
            self._pools[device] = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        current, side = torch.cuda.current_stream(device), self._stream(device)
        side.wait_stream(current)  # the static buffers' copies
        with torch.cuda.device(device):
            try:
                with torch.cuda.graph(graph, pool=self._pools[device], stream=side, capture_error_mode="thread_local"):
                    outputs = run(args)
            except BaseException:
                # where capture_end raises (an invalidated capture), torch.cuda.graph's exit neither
                # restores the current stream nor ends the allocator's routing to the pool
                torch.cuda.set_stream(current)
                with contextlib.suppress(Exception):
                    torch._C._cuda_endAllocateToPool(device, self._pools[device])
                _end_generator_capture(device)
                raise
        current.wait_stream(side)
        return graph, outputs

    def failed(self, device: int) -> None:
        """After a capture that raised: its stream is not used again (a capture that failed may leave
        the allocator routing that stream's allocations to the pool)."""
        self._streams.pop(device, None)


def _end_generator_capture(device: int) -> None:
    """After a capture that raised before its end: the device's default generator still counts
    offsets for a graph (capture_end registers them only when the capture ends well), and the
    process's next random op outside a graph raised "Offset increment outside graph capture". A
    clone of its state (seed and offset, not capturing) takes its place."""
    with contextlib.suppress(Exception):
        generator = torch.cuda.default_generators[device]
        generator.graphsafe_set_state(generator.clone_state())
