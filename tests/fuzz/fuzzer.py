"""A differential fuzzer: random chains of ATen ops over random layouts, minicomp against eager.

Each case is a small Python function written out as text (so a failure prints as a
runnable repro), built one op at a time: an op is kept only when eager runs it on the
values at hand, so every program is valid in eager. The case then runs eagerly and
through `minicomp.jit` on copies of the same inputs, and the two are compared:
values (16-bit results judged against a float64 reference, as minicomp rounds once
where eager rounds at every op), shapes, dtypes, requires_grad, the inputs after the
call (in-place writes) and, in training cases, every input's gradient.

    python tests/fuzz/fuzzer.py --cases 20000 --seed 0          # the long developer run
    python tests/fuzz/fuzzer.py --family extern --cases 200     # one family of ops
    python tests/fuzz/fuzzer.py --repro 0:1234                  # one case, printed and run
    python tests/fuzz/fuzzer.py --device cuda --cases 2000      # inputs on the GPU

Families (`FAMILIES`): pointwise, views, reductions, integer, extern; `all` mixes them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import linecache
import os
import random
import re
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: N812 - the programs' spelling

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int32, torch.int64]
LAYOUTS = ["contiguous", "transposed", "channels_last", "expanded", "offset", "overlapping", "scalar", "empty"]


# -- inputs ------------------------------------------------------------------------------------
def make_input(
    rng: random.Random, dtype: torch.dtype, layout: str, rank: int, device: str = "cpu"
) -> tuple[torch.Tensor, str]:
    """A tensor of `dtype` laid out as `layout`, and the Python text that makes it from a seed."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    shape = [rng.choice([1, 2, 3, 4, 5, 7, 8]) for _ in range(rank)]
    if layout == "scalar":
        shape = []
    if layout == "empty" and shape:
        shape[rng.randrange(len(shape))] = 0
    if layout == "channels_last":
        shape = (shape + [3, 4, 5, 6])[:4]

    def values(size):  # drawn on the CPU (the same numbers on every device), then moved
        if dtype.is_floating_point:
            return torch.randn(size, generator=gen).to(device=device, dtype=dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, size, generator=gen).bool().to(device)
        return torch.randint(-7, 8, size, generator=gen).to(device=device, dtype=dtype)

    if layout == "transposed" and len(shape) >= 2:
        base = values(shape[:-2] + [shape[-1], shape[-2]])
        return base.transpose(-1, -2), "transposed"
    if layout == "channels_last":
        return values(shape).contiguous(memory_format=torch.channels_last), "channels_last"
    if layout == "expanded" and shape:
        small = list(shape)
        dim = rng.randrange(len(shape))
        small[dim] = 1
        shape[dim] = max(shape[dim], 2)
        return values(small).expand(shape), "expanded"
    if layout == "offset" and shape:
        big = list(shape)
        big[0] += 2
        return values(big)[1 : 1 + shape[0]], "offset"
    if layout == "overlapping" and len(shape) >= 2:
        n = shape[-1]
        flat = values([shape[0] + n])
        return flat.as_strided((shape[0], n), (1, 1)), "overlapping"  # rows share elements
    return values(shape), "contiguous" if layout not in ("scalar", "empty") else layout


# -- ops -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    family: str
    text: str  # a format string over {a}, {b} (values), {r} (random choices), {like}/{on} ({a}'s dtype, device)
    arity: int = 1
    floats_only: bool = False
    ints_only: bool = False
    leaves_only: bool = False  # discontinuous at rounding ties: applied to inputs, not computed values
    choices: tuple = ()  # values {r} takes


BITCASTS = ("torch.int32", "torch.int16", "torch.float32", "torch.float16", "torch.bfloat16")


def _ops() -> list[Op]:
    p, v, r, i, e = "pointwise", "views", "reductions", "integer", "extern"
    return [
        Op(p, "torch.abs({a})"),
        Op(p, "torch.neg({a})"),
        Op(p, "torch.exp({a})", floats_only=True),
        Op(p, "torch.sin({a})", floats_only=True),
        Op(p, "torch.tanh({a})", floats_only=True),
        Op(p, "torch.sigmoid({a})", floats_only=True),
        Op(p, "torch.relu({a})"),
        Op(p, "torch.sqrt(torch.abs({a}))", floats_only=True),
        Op(p, "torch.log1p(torch.abs({a}))", floats_only=True),
        Op(p, "F.gelu({a})", floats_only=True),
        Op(p, "F.silu({a})", floats_only=True),
        Op(p, "torch.clamp({a}, min=-1, max=2)"),
        Op(p, "{a} * {r}", choices=(2, -1.5, 0.5, 3)),
        Op(p, "{a} + {b}", arity=2),
        Op(p, "{a} - {b}", arity=2),
        Op(p, "{a} * {b}", arity=2),
        Op(p, "torch.maximum({a}, {b})", arity=2),
        Op(p, "torch.where({a} > 0, {a}, {b})", arity=2),
        Op(p, "torch.copysign({a}, {b})", arity=2, floats_only=True),
        Op(p, "{a}.to({r})", choices=("torch.float32", "torch.float16", "torch.bfloat16", "torch.int32")),
        Op(p, "torch.floor({a})", floats_only=True, leaves_only=True),
        Op(p, "({a} > {b})", arity=2, leaves_only=True),
        Op(v, "{a}.transpose(0, -1)"),
        Op(v, "{a}.unsqueeze({r})", choices=(0, -1)),
        Op(v, "{a}.flatten()"),
        Op(v, "{a}.reshape(-1, 1)"),
        Op(v, "{a}[..., ::{r}]", choices=(2, 3)),
        Op(v, "{a}[1:]"),
        Op(v, "{a}.flip(0)"),
        Op(v, "torch.cat([{a}, {b}], dim=0)", arity=2),
        Op(v, "torch.stack([{a}, {a}], dim=-1)"),
        Op(v, "{a}.expand(2, *{a}.shape)"),
        # a bitcast turns a float's last-bit rounding into an integer difference: of inputs only
        Op(
            v,
            "{a}.view({r})",
            leaves_only=True,
            choices=("torch.int32", "torch.int16", "torch.float32", "torch.bfloat16"),
        ),
        Op(v, "{a}.contiguous()"),
        Op(r, "{a}.sum({r})", choices=("", "dim=0", "dim=-1, keepdim=True")),
        Op(r, "{a}.amax({r})", choices=("", "dim=0", "dim=-1")),
        Op(r, "{a}.amin(dim=-1)"),
        Op(r, "{a}.mean(dim=-1)", floats_only=True),
        Op(r, "{a}.prod(dim=-1)"),
        Op(r, "{a}.argmax(dim=-1)", leaves_only=True),
        Op(r, "torch.softmax({a}, dim=-1)", floats_only=True),
        Op(r, "torch.logsumexp({a}, dim=-1)", floats_only=True),
        Op(r, "{a}.var(dim=-1)", floats_only=True),
        Op(i, "{a}.abs().amax()", ints_only=True),
        Op(i, "{a}.amin(dim=-1)", ints_only=True),
        Op(i, "{a}.argmin(dim=-1)", ints_only=True),
        Op(i, "{a}.sum(dtype=torch.int8)", ints_only=True),
        Op(i, "{a}.prod(dim=-1)", ints_only=True),
        Op(i, "{a} // {r}", ints_only=True, choices=(2, 3, -4)),
        Op(i, "{a} % {r}", ints_only=True, choices=(2, 5)),
        Op(i, "{a} & {b}", arity=2, ints_only=True),
        Op(
            e,
            "F.relu(F.conv2d({a}, torch.ones(2, {a}.shape[1], 1, 1, {like})))",
            floats_only=True,
        ),
        Op(
            e,
            "F.relu(F.conv1d({a}, torch.ones(3, {a}.shape[1], 2, {like})))",
            floats_only=True,
        ),
        Op(e, "F.pad({a}, (1, 1), mode='circular') * 2", floats_only=True),
        Op(e, "torch.fft.rfftn({a}).abs() + 1", floats_only=True),
        Op(e, "torch.fft.irfft({a}) * 2", floats_only=True),
        Op(e, "torch.linalg.svd({a}, full_matrices=False).Vh.abs() * 2", floats_only=True),
        Op(e, "({a} @ {b}) + 1", arity=2, floats_only=True),
        Op(
            e,
            "F.batch_norm({a}, torch.zeros({a}.shape[1], {on}), torch.ones({a}.shape[1], {on})) + 1",
            floats_only=True,
        ),
    ]


OPS = _ops()
FAMILIES = ["pointwise", "views", "reductions", "integer", "extern"]
# the values each family's programs start from: dtypes and layouts
FAMILY_DTYPES = {"integer": INTS, "extern": [torch.float32], "views": FLOATS + INTS}


# -- a case --------------------------------------------------------------------------------------
@dataclass
class Case:
    seed: int
    family: str
    training: bool
    inputs: list[torch.Tensor]
    input_text: list[str]
    lines: list[str] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)
    prefix: str = "x"  # parameters are named x0, x1, ... (or a0, in0, ...)

    @property
    def source(self) -> str:
        params = ", ".join(f"{self.prefix}{k}" for k in range(len(self.inputs)))
        body = "\n".join(f"    {line}" for line in self.lines)
        return f"def f({params}):\n{body}\n    return ({', '.join(self.returned)},)\n"

    def repro(self) -> str:
        layouts = ", ".join(
            f"{self.prefix}{k}: {t} {tuple(x.shape)} {x.dtype}"
            for k, (x, t) in enumerate(zip(self.inputs, self.input_text))
        )
        mode = "training" if self.training else "no_grad"
        return f"# case {self.seed} ({self.family}, {mode}; {layouts})\n{self.source}"


def _function(source: str, name: str):
    """The case's function, compiled from its text with the text in linecache (inspect sees it)."""
    filename = f"<fuzz {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {"torch": torch, "F": F}
    exec(compile(source, filename, "exec"), scope)  # noqa: S102 - the fuzzer's own generated text
    return scope["f"]


def _eager(source, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _function(source, "eager")(*inputs)


def generate(seed: int, family: str = "all", device: str | None = None) -> Case:
    """Case `seed` of `family`: inputs, then ops kept while eager runs them."""
    rng = random.Random(seed)
    device = device or os.environ.get("MINICOMP_FUZZ_DEVICE", "cpu")
    fam = rng.choice(FAMILIES) if family == "all" else family
    dtypes = FAMILY_DTYPES.get(fam, FLOATS)
    training = fam in ("pointwise", "reductions", "views") and rng.random() < 0.25
    inputs, texts = [], []
    for _ in range(rng.choice([1, 2, 2, 3])):
        layout = rng.choice(LAYOUTS if fam != "extern" else ["contiguous", "transposed", "channels_last", "offset"])
        dtype = rng.choice(dtypes)
        rank = rng.choice([1, 2, 3, 4]) if fam != "extern" else rng.choice([2, 3, 4])
        x, text = make_input(rng, dtype, layout, rank, device)
        if training and x.dtype.is_floating_point:
            x = x.detach().requires_grad_(True)
        inputs.append(x)
        texts.append(text)
    prefix = rng.choice(["x", "a", "inp"])
    case = Case(seed, fam, training and any(x.requires_grad for x in inputs), inputs, texts, prefix=prefix)
    names = [f"{prefix}{k}" for k in range(len(inputs))]
    leaves = set(names)
    pool = [op for op in OPS if op.family == fam or (fam != "pointwise" and op.family == "pointwise")]
    values = {n: x for n, x in zip(names, inputs)}
    for step in range(rng.choice([2, 3, 4, 5, 6])):
        op = rng.choice(pool)
        a = rng.choice(list(values))
        b = rng.choice(list(values))
        if op.leaves_only and a not in leaves:
            continue
        if (op.floats_only and not values[a].dtype.is_floating_point) or (
            op.ints_only and values[a].dtype.is_floating_point
        ):
            continue
        like, on = f"dtype={a}.dtype, device={a}.device", f"device={a}.device"  # new tensors beside {a}
        expr = op.text.format(a=a, b=b, r=rng.choice(op.choices) if op.choices else "", like=like, on=on)
        name = f"t{step}"
        try:
            trial = Case(seed, fam, case.training, inputs, texts, case.lines + [f"{name} = {expr}"], [name], prefix)
            out = _eager(trial.source, [x.detach().clone() for x in inputs])[0]
        except Exception:  # noqa: BLE001 - eager refuses this op here: try another
            continue
        if not isinstance(out, torch.Tensor) or out.numel() > 1 << 14:
            continue
        case.lines.append(f"{name} = {expr}")
        values[name] = out
    if not case.lines:
        case.lines.append(f"t0 = {names[0]}.clone()")
        values["t0"] = inputs[0]
    computed = [n for n in values if n not in leaves]
    case.returned = [computed[-1]] + ([rng.choice(computed)] if len(computed) > 1 and rng.random() < 0.4 else [])
    return case


# -- comparing -------------------------------------------------------------------------------------
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4, torch.float64: 1e-7}


@dataclass
class Finding:
    case: Case
    kind: str  # "wrong value", "wrong metadata", "crash", "wrong gradient", "wrong input after call"
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}\n{self.case.repro()}"

    def summary(self) -> tuple[str, int, str, str]:
        """(family, seed, kind, text): what crosses a process boundary."""
        return (self.case.family, self.case.seed, self.kind, str(self))


def _run(fn, inputs, training):
    args = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    context = contextlib.nullcontext() if training else torch.no_grad()
    with context, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(*args)
    grads = None
    if training:
        floats = [o for o in out if isinstance(o, torch.Tensor) and o.requires_grad]
        if floats:
            total = sum(o.float().sum() for o in floats)
            params = [a for a in args if a.requires_grad]
            grads = torch.autograd.grad(total, params, allow_unused=True)
    return out, args, grads


def _close(
    got: torch.Tensor, want: torch.Tensor, reference: torch.Tensor | None, tol: float | None = None
) -> str | None:
    """None when `got` matches `want`, else what differs."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {tuple(got.shape)} {got.dtype}, eager {tuple(want.shape)} {want.dtype}"
    if got.numel() == 0:
        return None
    if not got.dtype.is_floating_point and not got.dtype.is_complex:
        return None if torch.equal(got, want) else f"integer values differ ({(got != want).sum().item()} elements)"
    g, w = got.detach().double(), want.detach().double()
    tol = tol if tol is not None else TOLERANCE.get(got.dtype, 1e-4)
    same = (g - w).abs() <= tol + tol * w.abs()
    same |= (g.isnan() & w.isnan()) | (g == w)
    if bool(same.all()):
        return None
    if reference is not None and reference.shape == got.shape:  # minicomp rounds once: no worse than eager
        r = reference.detach().double()
        ok = (g - r).abs() <= (w - r).abs() + tol + tol * r.abs()
        if bool((ok | same).all()):
            return None
    worst = ((g - w).abs().nan_to_num(float("inf"))).max().item()
    return f"values differ by up to {worst:.3g} ({(~same).sum().item()} of {got.numel()} elements)"


def _program_tolerance(case: Case, dtype: torch.dtype) -> float:
    """An output's tolerance: its dtype's, or a 16-bit one where the program holds 16-bit values
    on the way (minicomp rounds them once, at the store, as documented; a program that casts to
    16 bits itself has a float64 reference that rounds there too)."""
    low = [
        d for d in (torch.float16, torch.bfloat16) if str(d) in case.source or any(x.dtype == d for x in case.inputs)
    ]
    return max([TOLERANCE.get(dtype, 1e-4)] + [TOLERANCE[d] for d in low])


def _reference(case: Case):
    """The case in float64 (16-bit and float32 inputs upcast), or None where it cannot run so."""
    up = [x.detach().double() if x.dtype.is_floating_point else x.detach() for x in case.inputs]
    try:
        with torch.no_grad():
            return _eager(case.source, up)
    except Exception:  # noqa: BLE001 - an op without float64: no reference
        return None


def _ill_conditioned(case: Case, k: int, got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    """Whether every element where `got` and `want` differ moves as much in eager itself when the
    floating inputs move by a few units in the last place: an output an ulp of difference upstream
    may change wholesale (the singular vector of a rank-deficient matrix, as circular padding makes
    one), where no compiler can match eager's bits; or an integer made from floats at a rounding
    boundary (`log1p(exp(x)).to(int32)` of 16-bit x: eager rounds each op, minicomp once, and the
    value sits an ulp from an integer: long-run case 109173). Judged only on values, never on
    metadata."""
    floats = any(x.dtype.is_floating_point for x in case.inputs)
    if got.shape != want.shape or not (want.dtype.is_floating_point or floats) or want.dtype == torch.bool:
        return False
    g, w = got.detach().double(), want.detach().double()
    ulps = 16  # (a well-conditioned output moves by ~16 ulps times its condition: far below tol)
    if not want.dtype.is_floating_point:
        tol, ulps = 0.0, 1  # an integer moves by one at least; one ulp, so a boundary bug still shows
    differ = (g - w).abs() > tol + tol * w.abs()
    moved = torch.zeros_like(differ)
    for seed in range(4):
        noise = torch.Generator().manual_seed(seed)
        nudged = [
            x * (1 + ulps * torch.finfo(x.dtype).eps * torch.randn(x.shape, generator=noise).to(x.dtype))
            if x.dtype.is_floating_point
            else x
            for x in case.inputs
        ]
        try:
            with torch.no_grad():
                out = _eager(case.source, nudged)[k].detach().double()
        except Exception:  # noqa: BLE001 - eager fails on the nudged inputs: no verdict from them
            return False
        moved |= (out - w).abs() > tol + tol * w.abs()
    return bool((moved | ~differ).all())


def _reference_grads(case: Case):
    """The case's gradients in float64 (floating inputs upcast, as `_reference`), or None."""
    up = [x.detach().double().requires_grad_(x.requires_grad) if x.dtype.is_floating_point else x for x in case.inputs]
    try:
        return _run(_function(case.source, f"{case.seed}r"), up, True)[2]
    except Exception:  # noqa: BLE001 - an op without float64 or its gradient: no reference
        return None


def _nan_signed(case: Case) -> bool:
    """Whether a copysign or signbit of the case reads a NaN: IEEE 754 leaves the sign of a NaN
    an op makes unspecified (x86's 0 / 0 is negative, eager's empty var positive, a GPU's
    positive), so what it copies is no verdict on minicomp (long-run case 101437)."""
    signed = [line for line in case.lines if "torch.copysign(" in line or "torch.signbit(" in line]
    if not signed:
        return False
    names = [line.split(" = ", 1)[0] for line in case.lines]
    probe = Case(case.seed, case.family, False, case.inputs, case.input_text, case.lines, names, case.prefix)
    try:
        with torch.no_grad():
            values = dict(zip(names, _eager(probe.source, case.inputs)))
    except Exception:  # noqa: BLE001 - no verdict from a probe that fails
        return False
    values.update((f"{case.prefix}{k}", x) for k, x in enumerate(case.inputs))
    for line in signed:
        used = re.findall(r"\b[A-Za-z_]+\d+\b", line.split(" = ", 1)[1])
        if any(isinstance(values.get(n), torch.Tensor) and values[n].isnan().any() for n in used):
            return True
    return False


class Refused(Exception):
    """minicomp refused the case cleanly (it would run eagerly): not a finding, but counted."""


def check(case: Case) -> Finding | None:
    """The case's finding, or None when minicomp matches eager; raises Refused when minicomp
    does not compile it (the user's call would run eagerly, with a warning)."""
    import minicomp

    eager_out, eager_args, eager_grads = _run(_function(case.source, f"{case.seed}e"), case.inputs, case.training)
    compiled = minicomp.jit(_function(case.source, f"{case.seed}"), fallback="raise")
    try:
        out, args, grads = _run(compiled, case.inputs, case.training)
    except minicomp.CompileError as err:
        raise Refused(str(err).splitlines()[0]) from None
    except Exception as err:  # noqa: BLE001 - eager ran it: any other exception is a finding
        return Finding(case, "crash", f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")
    reference = _reference(case)
    for k, (got, want) in enumerate(zip(out, eager_out)):
        if not isinstance(want, torch.Tensor):
            continue
        if got.requires_grad != want.requires_grad:
            return Finding(
                case, "wrong metadata", f"output {k} requires_grad {got.requires_grad}, eager {want.requires_grad}"
            )
        ref = reference[k] if reference is not None and want.dtype.is_floating_point else None
        ref = ref.to(want.dtype) if ref is not None and ref.is_floating_point() else ref
        tol = _program_tolerance(case, want.dtype)
        if (problem := _close(got, want, ref, tol)) is not None and _nan_signed(case):
            problem = _close(got.abs(), want.abs(), None, tol) if want.dtype.is_floating_point else None
        if problem is not None and not _ill_conditioned(case, k, got, want, tol):
            return Finding(case, "wrong value" if "values" in problem else "wrong metadata", f"output {k}: {problem}")
    for k, (got, want) in enumerate(zip(args, eager_args)):
        if (problem := _close(got, want, None)) is not None:
            return Finding(case, "wrong input after call", f"{case.prefix}{k}: {problem}")
    if eager_grads is not None:
        if grads is None:
            return Finding(case, "wrong gradient", "no gradients")
        references = None
        for k, (got, want) in enumerate(zip(grads, eager_grads)):
            if (got is None) != (want is None):
                return Finding(case, "wrong gradient", f"gradient {k}: {got is None=} {want is None=}")
            # a gradient sums products of the program's values: as precise as its least precise
            # input or the 16-bit values it holds on the way (eager's backward rounds each to 16 bits)
            tol = max(_program_tolerance(case, x.dtype) for x in case.inputs if x.dtype.is_floating_point)
            if want is None or _close(got, want, None, tol) is None:
                continue
            # no worse than eager against float64 (eager's 16-bit prod backward divides rounded
            # values: minicomp, rounding once, was the nearer one in long-run case 70017)
            references = _reference_grads(case) if references is None else references
            ref = references[k] if references and references[k] is not None else None
            if (problem := _close(got, want, None if ref is None else ref.to(want.dtype), tol)) is not None:
                if _nan_signed(case) and _close(got.abs(), want.abs(), None, tol) is None:
                    continue  # copysign's gradient is the sign it copied
                return Finding(case, "wrong gradient", f"gradient {k}: {problem}")
    return None


def run(seeds, family: str = "all", verbose: bool = False) -> tuple[int, list[Finding], int]:
    """Check every case of `seeds`: (cases run, findings, cases minicomp refused)."""
    findings, count, refused = [], 0, 0
    for seed in seeds:
        case = generate(seed, family)
        count += 1
        try:
            finding = check(case)
        except Refused as why:
            refused += 1
            if verbose:
                print(f"case {seed}: refused ({why})", file=sys.stderr)
            continue
        if finding is not None:
            findings.append(finding)
            if verbose:
                print(finding, flush=True)
    return count, findings, refused


def _child(seeds: range, family: str) -> tuple[int, list[tuple], int] | None:
    """Run `seeds` in a child process: (cases, findings as `summary` tuples, refused), or None when it died
    (a crash of the process itself: memory corruption, an abort)."""
    import json
    import subprocess

    command = [sys.executable, "-W", "ignore", __file__, "--seed", str(seeds.start), "--cases", str(len(seeds))]
    done = subprocess.run(command + ["--family", family, "--json"], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode not in (0, 1) or not lines or not lines[-1].startswith("{"):
        return None  # it died (or could not start): the caller runs its cases one a process
    result = json.loads(lines[-1])
    return result["cases"], [tuple(f) for f in result["findings"]], result["refused"]


def run_isolated(seeds: range, family: str, chunk: int = 50) -> tuple[int, list[tuple], int]:
    """`run` in child processes of `chunk` cases; a chunk whose process dies is run again a case a
    process, and the case that kills its process is a finding."""
    count, findings, refused = 0, [], 0
    for start in range(seeds.start, seeds.stop, chunk):
        part = range(start, min(start + chunk, seeds.stop))
        results = [_child(part, family)]
        if results[0] is None:
            results = [_child(range(seed, seed + 1), family) for seed in part]
            for k, (seed, one) in enumerate(zip(part, results)):
                if one is None:
                    case = generate(seed, family)
                    results[k] = (1, [(case.family, seed, "process crash", f"process crash\n{case.repro()}")], 0)
        for cases, found, skipped in results:
            count, findings, refused = count + cases, findings + found, refused + skipped
            for *_, text in found:  # as they come: a long run stopped early keeps what it found
                print(text, "\n", file=sys.stderr, flush=True)
        print(f"{count} cases, {len(findings)} findings, {refused} refused", file=sys.stderr, flush=True)
    return count, findings, refused


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="the first case's seed")
    parser.add_argument("--family", default="all", choices=["all", *FAMILIES])
    parser.add_argument("--repro", help="FAMILY:SEED or SEED: print one case and check it")
    parser.add_argument("--isolate", action="store_true", help="run cases in child processes (survives crashes)")
    parser.add_argument("--json", action="store_true", help="print one JSON line: cases and findings")
    parser.add_argument("--device", help="where the inputs live (cpu, cuda); children inherit it")
    args = parser.parse_args(argv)
    if args.device:
        os.environ["MINICOMP_FUZZ_DEVICE"] = args.device
    if args.repro:
        family, _, seed = args.repro.rpartition(":")
        case = generate(int(seed), family or args.family)
        print(case.repro())
        try:
            finding = check(case)
        except Refused as why:
            print(f"refused: {why}")
            return 0
        print(finding or "matches eager")
        return 1 if finding else 0
    start = time.perf_counter()
    seeds = range(args.seed, args.seed + args.cases)
    if args.isolate:
        count, found, refused = run_isolated(seeds, args.family)
    else:
        count, findings, refused = run(seeds, args.family)
        found = [f.summary() for f in findings]
    if args.json:
        import json

        print(json.dumps({"cases": count, "findings": found, "refused": refused}))
        return 1 if found else 0
    for *_, text in found:
        print(text)
    kinds = collections.Counter(f"{family}: {kind}" for family, _, kind, _ in found)
    print(f"\n{count} cases in {time.perf_counter() - start:.0f} s, {len(found)} findings, {refused} refused")
    for kind, n in kinds.most_common():
        print(f"  {n:5d}  {kind}")
    print("seeds:", " ".join(f"{family}:{seed}" for family, seed, *_ in found))
    return 1 if found else 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
