"""Where RoPE forward + backward spends its time beyond the memory floor.

    python -m benchmarks.experiments.rope_training OUT.json

For q, k of [8, 32, 2048, 128] in float32 and bfloat16: the whole training
step (as `minicomp bench` times it), the forward kernel alone, the backward
kernel alone at each launch configuration, and, from a torch.profiler trace
of a few steps, how much of a step the GPU spends in kernels versus idle.
Each as a multiple of its own memory floor.
"""

import itertools
import json
import sys

import torch

import minicomp
from benchmarks.experiments import harness
from minicomp.bench import measure
from minicomp.tools.workloads import rope

CONFIGS = [
    (128, 1),
    (256, 1),
    (256, 2),
    (512, 1),
    (512, 2),
    (512, 4),
    (1024, 2),
    (1024, 4),
    (2048, 4),
    (1024, 8),
    (2048, 8),
    (4096, 8),
]


def config_sweep(run, compiled, sets, floor_ms) -> dict[str, float]:
    """The module's one kernel at each of CONFIGS, as a multiple of the floor."""
    launch_bare = harness.bare(compiled)
    return {
        f"{block}x{warps}": run.bench(lambda *s, b=block, w=warps: launch_bare(*s, block=b, warps=w), sets) / floor_ms
        for block, warps in (CONFIGS[:1] if run.tiny else CONFIGS)
    }


def gpu_busy(step, steps: int = 10) -> dict:
    """Kernel time vs wall time of `steps` training steps, from a torch.profiler trace."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    start = min(e.time_range.start for e in kernels)
    end = max(e.time_range.end for e in kernels)
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us() / steps
    return dict(span_us_per_step=(end - start) / steps, kernel_us_per_step=by_name)


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows = []
    for dname, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        sets = run.input_sets(run.rope_inputs(), 8 if run.tiny else 2048, dtype)
        floor = lambda nbytes: nbytes / bandwidth * 1e3  # noqa: E731
        harness.fresh_cache()
        fn = minicomp.jit(rope)
        entry = fn.entry(*sets[0])
        row = dict(dtype=dname)
        moved = measure.floor_bytes(sets[0], measure.flat_tensors(rope(*sets[0])), True)
        row["step_x_floor"] = run.time_ms(fn, sets, True) / floor(moved)

        with torch.no_grad():
            forward_sets = [[t.detach() for t in s] for s in sets]
            fw_bytes = measure.tensor_bytes(forward_sets[0]) + measure.tensor_bytes(forward_sets[0][:2])  # + outputs
            row["forward_x_floor"] = run.bench(entry.forward.call, forward_sets) / floor(fw_bytes)
            # backward inputs: what the forward saved (cos, sin) and one gradient per output
            backward_sets = [[s[2], s[3], torch.randn_like(s[0]), torch.randn_like(s[1])] for s in forward_sets]
            bw_bytes = 2 * measure.tensor_bytes(backward_sets[0][2:]) + measure.tensor_bytes(backward_sets[0][:2])
            row["backward_x_floor"] = run.bench(entry.backward.call, backward_sets) / floor(bw_bytes)
            row["backward_tuned_config"] = list(entry.backward.launch(entry.backward.kernels[0]).config or [])
            row["backward_kernel_x_floor_by_config"] = config_sweep(run, entry.backward, backward_sets, floor(bw_bytes))
            row["forward_kernel_x_floor_by_config"] = config_sweep(run, entry.forward, forward_sets, floor(fw_bytes))

        pairs = [(s, [torch.randn_like(s[0]), torch.randn_like(s[1])]) for s in sets]

        cycle = itertools.cycle(pairs)

        def step():
            inputs, grads = next(cycle)
            outs = fn(*inputs)
            torch.autograd.backward(outs, grads)
            for t in inputs[:2]:
                t.grad = None

        for _ in range(5):
            step()
        if not run.tiny:
            row["profile"] = gpu_busy(step)
        row["floor_us_per_step"] = floor(moved) * 1e3
        row["backward_source"] = entry.backward.source[entry.backward.source.index("@triton.jit") :]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "backward_source"}), flush=True)
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
