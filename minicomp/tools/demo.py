"""`minicomp demo`: compile the seed workloads, check each against eager, show one generated module.

Prints one line per workload (result checked against eager, kernels launched, time of the first
call, which includes compiling), then the generated module of one of them (RoPE unless `--code`
names another, or `all`). Runs on the GPU when there is one, else on the CPU through Triton's
interpreter.
"""

from __future__ import annotations

import argparse
import time

SEEDS = ("gelu_tanh", "gelu_erf", "bias_relu", "lora_epilogue", "swiglu", "rope_fw")


def parse(argv):
    parser = argparse.ArgumentParser(
        prog="minicomp demo",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "workloads",
        nargs="*",
        default=list(SEEDS),
        metavar="WORKLOAD",
        help=f"which to compile (default: all of {', '.join(SEEDS)})",
    )
    parser.add_argument(
        "--code",
        default=None,
        metavar="WORKLOAD|all|none",
        help="whose generated module to print (default: rope_fw, or the last workload named)",
    )
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads if w not in SEEDS]
    if unknown:
        parser.error(f"unknown workload {unknown[0]!r}: choose from {', '.join(SEEDS)}")
    if args.code is None:
        args.code = "rope_fw" if "rope_fw" in args.workloads else args.workloads[-1]
    if args.code not in ("all", "none", *args.workloads):
        parser.error(
            f"--code {args.code}: name one of the workloads compiled ({', '.join(args.workloads)}), all or none"
        )
    return args


def main(argv=None) -> int:
    args = parse(argv)
    import torch  # after parsing: `--help` loads nothing

    from minicomp.dispatch.jit import jit
    from minicomp.tools.workloads import WORKLOADS

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = device.type == "cpu"
    print(f"minicomp demo on {device} ({'Triton interpreter' if small else torch.cuda.get_device_name()})\n")
    failures, shown = 0, []
    for name in args.workloads:
        work = WORKLOADS[name]
        if name == "rope_fw":
            inputs = work.make(16 if small else 2048, torch.float32, device)
        else:
            inputs = work.make(8 if small else work.sizes[-1], torch.float32, device)
            if small:
                inputs = [t[..., :96].contiguous() for t in inputs]
        compiled = jit(work.fn)
        start = time.perf_counter()
        got = compiled(*inputs)
        first = time.perf_counter() - start
        expected = work.fn(*inputs)
        ok = all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(_flat(got), _flat(expected)))
        failures += not ok
        source = compiled.source(*inputs)
        kernels = len(compiled.compiled(*inputs).kernels)
        shapes = ", ".join(str(list(t.shape)) for t in inputs)
        status = "ok " if ok else "BAD"
        print(f"{status} {name:14s} {kernels} kernel(s)  first call {first * 1e3:7.1f} ms  inputs {shapes}")
        if args.code in ("all", name):
            shown.append((name, source))
    for name, source in shown:
        print(f"\n==== generated module: {name} ====\n")
        print(source.rstrip())
    others = [n for n in args.workloads if n not in {s for s, _ in shown}]
    if others and args.code != "none":
        print(
            f"\nAnother workload's module: `minicomp demo --code {others[0]}` (or `--code all`); "
            f"every stage of one: `minicomp explain {others[0]}`."
        )
    return 1 if failures else 0


def _flat(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]
