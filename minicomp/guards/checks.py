"""Checks outside the signature key: per call, only by the entries that need them, and while tracing.

Per call: an entry that writes into an input runs eagerly when that input shares memory with
another argument or a tensor the function closes over (`shares_memory`); one whose trace holds
float tensors the function closes over runs eagerly once one of them requires grad
(`grad_watched`, `constants_need_grad`).
While tracing, what a compiled graph cannot keep is refused with an exception of its own
(the signature then runs eagerly): a closed-over tensor that requires grad, an autograd hook,
a number read from tensor values, a change to Python state, an argument minicomp cannot watch.
"""

from __future__ import annotations

import torch

# -- checked per call, only by entries that need it ------------------------------------


def shares_memory(leaves, slots, tensor_slots, constants=()) -> bool:
    """Does a tensor at `slots` (inputs the entry writes into) share storage with another argument,
    or with one of `constants` (the tensors the function closes over: `f(W)` where f reads the
    global `W`)? The compiled code reads each input and constant as it was before the call: eager
    would see the write. Storages are compared by the bytes they span: two of one numpy array
    (`torch.from_numpy(a[:6])`, `torch.from_numpy(a[2:])`) are two storages over shared memory."""
    for i in slots:
        written = _span(leaves[i])
        if any(j != i and _overlap(written, _span(leaves[j])) for j in tensor_slots):
            return True
        if any(_overlap(written, _span(c)) for c in constants):
            return True
    return False


def any_shared(tensors) -> bool:
    """Do two of `tensors` share memory (their storages' bytes overlap)?"""
    spans = sorted(span for span in map(_span, tensors) if span[0] < span[1])  # (by start: neighbours overlap)
    return any(_overlap(a, b) for a, b in zip(spans, spans[1:]))


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) of the bytes `t`'s storage spans."""
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def versions(leaves, tensor_slots) -> list[int]:
    """Each tensor argument's version counter: it moves when the tensor is written in place."""
    return [leaves[i]._version for i in tensor_slots]


class ConstantNeedsGrad(RuntimeError):
    """The trace holds a tensor the function closes over (a global weight, a module it names)
    that requires grad: a compiled graph treats it as a constant, so its gradient would be lost."""


def refuse_grad_constants(constants: list[torch.Tensor], grad_enabled: bool) -> None:
    """Raise ConstantNeedsGrad when grad mode is (was, at the call) on and a tensor the function
    closes over requires grad: eager would record its ops for autograd, and `backward()` fill
    its `.grad`."""
    if not grad_enabled:
        return
    for value in constants:
        if value.requires_grad:
            raise ConstantNeedsGrad(
                f"it closes over a tensor that requires grad (shape {list(value.shape)}), whose gradient a "
                "compiled graph cannot reach: pass it as an argument, or compile the module that owns it "
                "(minicomp.jit(module) or torch.compile(module, backend='minicomp'))"
            )


def grad_watched(constants: list[torch.Tensor]) -> list[torch.Tensor]:
    """The constants whose `requires_grad` a compiled entry checks on each call (the float ones:
    only they can require grad). A weight unfrozen after compiling (`p.requires_grad_()`) makes
    the entry run eagerly, where its gradient is recorded."""
    return [c for c in constants if c.is_floating_point() or c.is_complex()]


def constants_need_grad(watched: list[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(c.requires_grad for c in watched)


class GradHook(RuntimeError):
    """The function hooks into autograd (`y.retain_grad()`, `y.register_hook(fn)`): a compiled
    graph records values only, so eager's `.grad` or hook would never be there."""


class NumberFromValues(RuntimeError):
    """The function returns a Python number read from tensor values (`x.sum().item()`): a trace
    holds it as a symbol, which a compiled entry would hand back in place of the number."""


def refuse_numbers_from_values(leaves: list) -> None:
    for value in leaves:
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise NumberFromValues(
                "it returns a Python number read from tensor values (`.item()`, `.tolist()`), which "
                "compiled code cannot return: return the tensor and read the number outside the jitted function"
            )


# -- Python side effects of a trace ------------------------------------------------


class SideEffect(RuntimeError):
    """Tracing changed Python state (a module attribute, a global): the function runs eagerly."""


class Unguarded(RuntimeError):
    """An argument minicomp cannot watch for changes (an `Unguardable` leaf)."""


class ReadsValues(RuntimeError):
    """The function reads tensor values into Python (`int(t)`, `.item()`, `bool(t)`, `.tolist()`,
    `.numpy()`): a trace has no values to give it, and a number it read would be baked in."""


class OutDtype(RuntimeError):
    """An op given an `out=` tensor of another dtype than its result, its `dtype` unset: ATen
    computes it in `out`'s dtype (`torch.sum(x, 1, out=half)` sums in half), torch's
    functionalization in the result's and rounds once (capture/closed_over.py)."""


class TraceStopped(BaseException):  # noqa: N818 - not an error of the user's: the trace stops
    """Raised inside the function being traced where the trace cannot go on (a value read, an op
    only make_fx can follow): a BaseException, so that the function's own `except Exception` or
    `except IndexError` does not catch it and the except branch is not traced as the normal path.
    `refusal` is what the tracer raises once out of the function (capture/tracing.py)."""

    def __init__(self, refusal: Exception):
        super().__init__(str(refusal))
        self.refusal = refusal


class GradModeInside(RuntimeError):
    """A function called under no_grad turns grad mode on for a tensor that requires grad."""


# What a trace refuses in the user's code, by both tracers (the function then runs eagerly, and the
# warning gives the exception's own text); what a signature refuses besides, as the warning words it
TRACE_REFUSALS = (SideEffect, GradHook, GradModeInside, ReadsValues, OutDtype)
REFUSALS = (*TRACE_REFUSALS, Unguarded, ConstantNeedsGrad, NumberFromValues)
