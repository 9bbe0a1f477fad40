"""The host's µs of an ATen call through `OpOverload._op` against torch's Python binding (issue #39).

    PYTHONPATH=. python benchmarks/scripts/aten_call_paths.py

Generated code calls an extern ATen op through torch's own binding where codegen/aten_bindings.py
finds one that cannot pick another overload, else through `torch.ops.aten.X.default._op`. For ops
the suite's models call (ResNet-50's convolution, the transformers' addmm, mm, bmm, SDPA, layer
norm, embedding, cat) at small sizes on the GPU: µs a call both ways, the GPU held busy by a
sleep queued first (so the host never waits for it), the least of 5 rounds of 200 calls.
"""

import time

import torch

from minicomp.codegen import aten_bindings
from minicomp.ir import Ref, TensorMeta

ROUNDS, CALLS = 5, 200


def host_us(fn, args) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)
        start = time.perf_counter()
        for _ in range(CALLS):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / CALLS * 1e6)
    torch.cuda.synchronize()
    return best


def main() -> None:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, w = torch.randn(8, 64, 14, 14, **bf16).to(memory_format=torch.channels_last), torch.randn(64, 64, 3, 3, **bf16)
    w = w.to(memory_format=torch.channels_last)
    a, b, c = torch.randn(64, 128, **bf16), torch.randn(128, 256, **bf16), torch.randn(256, **bf16)
    q = torch.randn(2, 4, 64, 64, **bf16)
    ids = torch.randint(0, 64, (32,), device="cuda")
    aten = torch.ops.aten
    cases = {
        "convolution": (aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
        "addmm": (aten.addmm.default, (c, a, b)),
        "mm": (aten.mm.default, (a, b)),
        "bmm": (aten.bmm.default, (q[0], q[1])),
        "sdpa (efficient)": (aten._scaled_dot_product_efficient_attention.default, (q, q, q, None, False)),
        "native_layer_norm": (aten.native_layer_norm.default, (b, [256], c, c, 1e-5)),
        "embedding": (aten.embedding.default, (b, ids)),
        "cat": (aten.cat.default, ([a, a], 0)),
    }
    for name, (op, args) in cases.items():
        values = {}

        def meta_of(ref: str, values=values):
            t = values[ref]
            return TensorMeta(tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

        refs = []
        for i, v in enumerate(args):
            if isinstance(v, torch.Tensor):
                values[f"v{i}"] = v
                refs.append(Ref(f"v{i}"))
            elif isinstance(v, list) and v and isinstance(v[0], torch.Tensor):
                refs.append([Ref(f"v{i}_{j}") for j in range(len(v))])
                values.update({f"v{i}_{j}": t for j, t in enumerate(v)})
            else:
                refs.append(v)
        bound = aten_bindings.binding(op, tuple(refs), {}, meta_of)
        fn = eval(bound) if bound else None  # noqa: S307 - a dotted name from torch._C
        line = f"{name:20s} _op {host_us(op._op, args):6.2f} us"
        line += f"   {bound} {host_us(fn, args):6.2f} us" if fn else "   (no binding: _op kept)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
