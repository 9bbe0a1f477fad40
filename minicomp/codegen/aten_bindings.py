"""Which Python function a generated `call` runs an ATen op through (codegen/wrapper.py).

`torch.ops.aten.X.default._op(...)` goes through the dispatcher's boxed path: every argument is
converted to an IValue against the schema and back to the kernel's C++ types (on the CPU machine a
convolution's call takes 10.3 us that way, 4.5 through torch's own binding; mm 2.8 against 1.8:
docs/experiments.md). torch's generated Python bindings (`torch._C._VariableFunctions`, `_nn`,
`_linalg`, `_special`, `_fft`) parse the arguments straight into the unboxed call, as Inductor's
`extern_kernels` do. One binding serves every overload of a name and picks one by the arguments,
so a call goes through it only where that cannot pick another overload:

- the overload is not mutable (an in-place or `out=` op keeps `_op`);
- no other overload of the name, `out=` variants aside, takes as many positional arguments and the
  same keyword names (`add.Tensor` and `add.Scalar` both take two: `_op`);
- the binding, called once on meta tensors of the call's inputs, returns what the overload
  returns there (shapes, strides, dtypes): the binding exists for this overload and accepts these
  arguments. A value without a meta form, an op without a meta kernel, and a call that reads no
  value or names a device (a factory: its probe would run for real) keep `_op`.

A binding dispatches on `__torch_function__` where `_op` does not: the generated `call` runs with
torch functions disabled (templates/module.py.j2) when it uses one, so that a mode active around a
jitted call does not see the ATen ops it was traced into (Dynamo already runs compiled code so).
"""

from __future__ import annotations

import functools

import torch

from minicomp.ir import Ref, TensorMeta

NAMESPACES = ("_VariableFunctions", "_nn", "_linalg", "_special", "_fft")  # (attributes of torch._C)


def binding(target, args: tuple, kwargs: dict, meta_of) -> str | None:
    """The dotted name of the Python binding that runs `target(*args, **kwargs)` as `target` does,
    or None (the call keeps `target._op`). `meta_of(name)`: the TensorMeta of the value a Ref
    names (or anything else where it has none)."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    if "device" in kwargs or not _reads_a_value(args):  # (a factory: its probe would run for real)
        return None
    module = _module(target, len(args), tuple(sorted(kwargs)))
    if module is None:
        return None
    try:
        meta_args, meta_kwargs = _on_meta(args, meta_of), _on_meta(kwargs, meta_of)
    except _NoMeta:
        return None
    fn = getattr(getattr(torch._C, module), target._opname)
    try:
        with torch._C.DisableTorchFunction():
            same = _alike(target(*meta_args, **meta_kwargs), fn(*meta_args, **meta_kwargs))
    except Exception:  # noqa: BLE001 - no meta kernel, or the binding refuses these arguments
        return None
    return f"torch._C.{module}.{target._opname}" if same else None


@functools.cache
def _module(target, positional: int, keywords: tuple[str, ...]) -> str | None:
    """The torch._C module whose binding of `target`'s name cannot pick another overload for a
    call of `positional` arguments and these keyword names, or None."""
    schema = target._schema
    if schema.is_mutable:
        return None
    found = [m for m in NAMESPACES if hasattr(getattr(torch._C, m, None), target._opname)]
    if len(found) != 1:
        return None
    packet = getattr(torch.ops.aten, target._opname)
    for name in packet.overloads():
        other = getattr(packet, name)
        if other is target or any(a.is_out for a in other._schema.arguments):
            continue
        if _takes(other._schema, positional, keywords):
            return None
    return found[0]


def _takes(schema, positional: int, keywords: tuple[str, ...]) -> bool:
    """Whether a call of `positional` arguments and these keyword names could bind to `schema`:
    no more positional arguments than it has, each keyword one of its arguments past those, and
    every argument without a default given."""
    args = schema.arguments
    plain = [a for a in args if not a.kwarg_only]
    if positional > len(plain):
        return False
    rest = {a.name: a for a in args[positional:]}
    if not set(keywords) <= set(rest):
        return False
    return all(a.has_default_value() or a.name in keywords for a in rest.values())


def _reads_a_value(value) -> bool:
    """Whether an argument holds a Ref (the probe calls then run on meta tensors)."""
    if isinstance(value, Ref):
        return True
    if isinstance(value, (list, tuple)):
        return any(map(_reads_a_value, value))
    return False


class _NoMeta(Exception):
    pass


def _on_meta(value, meta_of):
    """`value` (an argument) with each Ref as an empty meta tensor of its layout."""
    if isinstance(value, Ref):
        meta = meta_of(value.name)
        if not isinstance(meta, TensorMeta):
            raise _NoMeta(value.name)
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_on_meta(v, meta_of) for v in value)
    if isinstance(value, dict):
        return {k: _on_meta(v, meta_of) for k, v in value.items()}
    if isinstance(value, torch.device):  # (a device among the arguments: the probe would run there)
        raise _NoMeta("device")
    return value


def _alike(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and (a.shape, a.stride(), a.dtype, a.storage_offset()) == (b.shape, b.stride(), b.dtype, b.storage_offset())
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(map(_alike, a, b))
        )
    return type(a) is type(b) and (a == b or a != a)
