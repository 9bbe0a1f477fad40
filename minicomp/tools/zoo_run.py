"""One zoo model in one process: each mode against eager, a JSON line per mode (zoo.py reads them).

    python -m minicomp.tools.zoo_run MODEL MODE[,MODE...] [--device cpu]

Modes: `forward` (eval, no_grad) and `train` (train mode, the loss's backward) through
`torch.compile(model, backend="minicomp")`; `jit-forward` and `jit-train` the same through
`minicomp.jit(model)`. Each mode starts from a fresh model of the same seed and runs it three
times: eager in float32, eager in float64 (the reference), compiled in float32. A compiled
result is right when every output, the loss, every parameter's gradient and every buffer
afterwards (batch norm's running statistics) is no further from float64 eager than float32
eager is, doubled, plus 1e-4 of the value and 1e-5 of the tensor's largest magnitude
(tests/conftest.py's `no_worse_than_eager`, for float32). `fp32_vs_fp64` is float32 eager's own
largest error relative to its tensor's largest magnitude: the inputs' conditioning.

Every whole graph minicomp hands back to eager (a fallback.handle call, whatever the policy) is
recorded with its reason and whether that reason is one the README documents as unsupported.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import time
import traceback
import warnings

MODES = ("forward", "train", "jit-forward", "jit-train")
PREFIX = "ZOO "  # the lines zoo.py reads; everything else the child prints is ignored
RTOL, ATOL = 1e-4, 1e-5


def emit(kind: str, **record) -> None:
    print(PREFIX + json.dumps(dict(kind=kind, **record)), flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name, modes = argv[0], argv[1].split(",")
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
    import torch

    from minicomp.tools.zoo_models import MODELS

    spec = MODELS[name]
    try:
        package = __import__(spec.source)
    except Exception as err:  # noqa: BLE001 - torchvision built for another torch raises more than ImportError
        for mode in modes:
            emit("result", model=name, mode=mode, verdict="skipped", detail=f"{spec.source}: {_first_line(err)}")
        return 0
    if spec.source == "transformers":
        package.logging.set_verbosity_error()
    torch.use_deterministic_algorithms(False)
    # float32 means float32 on a GPU too: TF32 convolutions and matmuls (cuDNN's default) would be
    # further from float64 than the CPU's float32 eager, and a batch norm over few samples magnifies it
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for mode in modes:
        emit("start", model=name, mode=mode)
        emit("result", model=name, mode=mode, **run_mode(spec, package, mode, torch.device(device)))
    return 0


def run_mode(spec, package, mode: str, device) -> dict:
    """Two calls (the first compiles, the second runs what is cached: in training the lean path),
    each judged against eager's same call; the verdict is the worse of the two."""
    import torch

    from minicomp.dispatch import fallback
    from minicomp.dispatch.jit import jit

    fallbacks = []
    handle = fallback.handle

    def recording(name, err, policy, instead="Running it eagerly.", stacklevel=2):
        why = fallback.describe(name, err)
        generic = why.startswith(f"minicomp could not compile {name}: {type(err).__name__}: ")
        fallbacks.append(dict(graph=name, reason=why.split(": ", 1)[1], documented=not generic))
        return handle(name, err, "silent" if policy == "warn" else policy, instead, stacklevel + 1)

    training = mode.endswith("train")
    try:
        torch.manual_seed(0)
        model, inputs = spec.build(torch, package)
        _no_dropout(model)
        model = model.to(device).train(training)
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        reference, subject = copy.deepcopy(model).double(), copy.deepcopy(model)
        want = [_step(spec, model, inputs, training) for _ in range(2)]
        ref = [_step(spec, reference, _double(inputs), training) for _ in range(2)]
        torch._dynamo.reset()
        compiled = jit(subject) if mode.startswith("jit") else torch.compile(subject, backend=_backend())
    except Exception as err:  # noqa: BLE001 - the harness or eager failed: not minicomp's verdict
        return dict(verdict="error", detail=f"eager: {type(err).__name__}: {_first_line(err)}")
    fallback.handle, got, seconds = recording, [], []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for call in (1, 2):
                started = time.perf_counter()
                _PHASE[:] = [f"call {call}, forward"]
                got.append(_step(spec, compiled, inputs, training, on_backward=lambda c=call: _set_phase(c)))
                seconds.append(round(time.perf_counter() - started, 2))
    except Exception as err:  # noqa: BLE001 - a crash of the compiled model
        return dict(
            verdict="crash",
            detail=f"{_PHASE[0]}: {type(err).__name__}: {_first_line(err)}",
            graph=_graph_of(err),
            compile_s=seconds[0] if seconds else round(time.perf_counter() - started, 2),
            fallbacks=fallbacks,
        )
    finally:
        fallback.handle = handle
    if mode.startswith("jit") and not fallbacks:
        fallbacks += _silent_eager(compiled)
    judged = [_judge(g, w, r) for g, w, r in zip(got, want, ref)]
    call, (worst, _) = max(enumerate(judged, 1), key=lambda x: x[1][0]["ratio"])
    result = dict(compile_s=seconds[0], second_s=seconds[1], fp32_vs_fp64=max(c for _, c in judged), worst=worst)
    result.update(fallbacks=fallbacks, graphs=None if mode.startswith("jit") else _dynamo_graphs())
    if fallbacks and not all(f["documented"] for f in fallbacks):
        f = next(f for f in fallbacks if not f["documented"])
        return dict(result, verdict="fallback", detail=f"{f['graph']}: {f['reason']}")
    if worst["ratio"] > 1:
        why = worst.get("why") or f"{worst['ratio']:.3g}x the tolerance"
        return dict(result, verdict="wrong", detail=f"call {call}, {worst['tensor']}: {why}")
    if fallbacks:
        return dict(result, verdict="unsupported", detail=f"{fallbacks[0]['graph']}: {fallbacks[0]['reason']}")
    return dict(result, verdict="right", detail="")


_PHASE = ["call 1, forward"]


def _set_phase(call: int) -> None:
    _PHASE[0] = f"call {call}, backward"


def _step(spec, model, inputs, training: bool, on_backward=lambda: None) -> dict:
    """Outputs (and in training the loss, every parameter's gradient, every buffer), by name:
    copies, so that a second step leaves them as they were."""
    import torch

    module = next(
        m for m in (getattr(model, "_orig_mod", None), getattr(model, "module", None), model) if m is not None
    )
    for p in module.parameters():
        p.grad = None
    with torch.set_grad_enabled(training):
        if spec.source == "transformers":
            out = model(**inputs)
        else:
            out = model(inputs["pixel_values"])
    values = {f"output{i}": t.detach().clone() for i, t in enumerate(_tensors(out))}
    if not training:
        return values
    loss = getattr(out, "loss", None)
    if loss is None:  # a library model: its logits against the labels
        logits = out if isinstance(out, torch.Tensor) else _tensors(out)[0]
        loss = torch.nn.functional.cross_entropy(logits, inputs["labels"])
    values["loss"] = loss.detach().clone()
    on_backward()
    loss.backward()
    values.update({f"grad {n}": p.grad for n, p in module.named_parameters()})
    values.update({f"buffer {n}": b.detach().clone() for n, b in module.named_buffers()})
    return values


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput
        value = value.to_tuple()
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _judge(got: dict, want: dict, ref: dict) -> tuple[dict, float]:
    """The worst tensor (its name and error / allowed error) and float32 eager's conditioning.

    A tensor that is zero in exact arithmetic (a key bias's gradient: softmax ignores it; the
    bias before another batch norm) holds only rounding noise: besides eager's own error per
    element, four times its largest is allowed. A sum that cancels (the classifier bias's gradient
    over a batch with both labels: 0.5 - 0.5) loses the digits of its terms, which no tensor of
    ours shows: an error of half ATOL of the largest tensor of the same kind is allowed
    everywhere (5e-6 of the largest gradient, far below what a training step resolves).
    Conditioning is measured against the largest magnitude among tensors of the same kind
    (outputs, gradients, buffers), so noise of that kind does not count."""
    import torch

    worst, cond = dict(tensor="", ratio=0.0), 0.0
    kinds: dict[str, float] = {}
    for name, r in ref.items():
        if r is not None and r.is_floating_point() and r.numel():
            kind = name.split(" ")[0]
            kinds[kind] = max(kinds.get(kind, 0.0), r.detach().abs().nan_to_num(0, 0, 0).max().item())
    for name, w in want.items():
        g, r = got.get(name), ref.get(name)
        if w is None or g is None:
            if (w is None) != (g is None):
                return dict(tensor=name, ratio=float("inf"), why="one of them is None"), cond
            continue
        if g.shape != w.shape or g.dtype != w.dtype:
            return dict(tensor=name, ratio=float("inf"), why=f"{tuple(g.shape)} {g.dtype} vs {tuple(w.shape)}"), cond
        if not g.numel():
            continue
        if not w.is_floating_point():
            ratio = 0.0 if torch.equal(g, w) else float("inf")
        else:
            g, w, r = g.detach().double(), w.detach().double(), r.detach().double().to(g.device)
            scale = r.abs().nan_to_num(0, 0, 0).max().item()
            own = (w - r).abs().nan_to_num(0, 0, 0)
            cond = max(cond, own.max().item() / max(scale, 1e-3 * kinds.get(name.split(" ")[0], 0.0), 1e-30))
            floor = ATOL / 2 * kinds.get(name.split(" ")[0], 0.0)  # of the largest tensor of its kind
            allowed = 2 * own + 4 * own.max() + RTOL * r.abs() + ATOL * scale + floor + 1e-30
            error = (g - r).abs().masked_fill(g.isnan() & w.isnan(), 0)
            ratio = (error / allowed).nan_to_num(float("inf")).max().item()
        if ratio > worst["ratio"]:
            worst = dict(tensor=name, ratio=ratio)
    return worst, cond


def _double(inputs: dict) -> dict:
    return {
        k: v.double() if hasattr(v, "is_floating_point") and v.is_floating_point() else v for k, v in inputs.items()
    }


def _no_dropout(model) -> None:
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for key, value in list(vars(m).items()):  # functional dropout rates, drop-path, layer drop
            if "drop" in key and isinstance(value, float):
                setattr(m, key, 0.0)


def _silent_eager(compiled) -> list:
    """minicomp.jit entries that ran eagerly without a fallback.handle call (aliased inputs)."""
    from minicomp.dispatch.entries import EagerEntry

    found = []
    for entry in compiled.compiled.cache.values():
        if isinstance(entry, EagerEntry) or getattr(entry, "forward", True) is None:
            found.append(
                dict(graph=type(compiled.module).__name__, reason="ran eagerly without a warning", documented=False)
            )
    return found


def _backend() -> str:
    from minicomp.dispatch.dynamo import registered

    return registered()


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _graph_of(err: BaseException) -> str:
    """The generated module the error came from (`dynamo_graph3_backward`), if any."""
    names = [re.search(r"(\w+)_[0-9a-f]{20}\.py$", f.filename) for f in traceback.extract_tb(err.__traceback__)]
    names = [m.group(1) for m in names if m]
    return names[-1] if names else ""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:300] if text else type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
