"""What a traced function does besides computing from its inputs: the real tensors it hands
to torch (what it closes over), writes into them, value reads, grad mode switched on inside,
autograd hooks. `ClosedOver` watches a trace and refuses (guards) what a graph cannot keep.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from minicomp import guards
from minicomp.capture import meta_trace


class ClosedOver(TorchFunctionMode):
    """While a function is traced, the real tensors it hands to torch: what it closes over (a
    global weight, a module it names, a RoPE table), as opposed to the traced inputs (fake or
    functional tensors) and what it computes from them. A graph holds them as constants, so
    one that requires grad would lose its gradient (guards.refuse_grad_constants). A call that
    hooks into autograd (`retain_grad`, `register_hook`) is refused while tracing: a graph keeps
    the values, not the hooks."""

    def __init__(self):
        super().__init__()
        self.tensors: dict[int, torch.Tensor] = {}
        self.grad_turned_on = False  # an op ran with grad mode on where the call had it off (enable_grad)
        self._grad_at_call = torch.is_grad_enabled()
        self.stopped: Exception | None = None  # why the trace stopped (guards.TraceStopped), if it did
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (a view of one of them, that one)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self._grad_at_call and torch.is_grad_enabled():
            self.grad_turned_on = True
        if func in _GRAD_HOOKS:
            raise guards.GradHook(
                f"it calls Tensor.{func.__name__}, which a compiled graph cannot keep: the hook (or the "
                "retained .grad) would never see the compiled backward"
            )
        if func in _VALUE_READS:
            self.stopped = guards.ReadsValues(
                "it branches on tensor values (e.g. `if x.sum() > 0`), which a trace cannot follow. Use "
                "torch.where for the branch, decide it from shapes or Python arguments, or keep that part "
                "outside the jitted function"
                if func is torch.Tensor.__bool__
                else f"it reads tensor values in Python (Tensor.{func.__name__}: `int(t)`, `.item()`, "
                "`.tolist()`, `.numpy()`), which a trace has none of: keep that read outside the jitted function"
            )
            raise guards.TraceStopped(self.stopped)
        if _fails_on_values(func, args) and _inside_a_try():
            self.stopped = guards.ReadsValues(
                f"it indexes by tensor values ({getattr(func, '__name__', func)}) inside its own try block: "
                "eager raises for an index out of range and takes the except branch, compiled code cannot"
            )
            raise guards.TraceStopped(self.stopped)
        kwargs = kwargs or {}
        if "out" in kwargs and _computes_in_out_dtype(func, args, kwargs):
            out = kwargs["out"]
            self.stopped = guards.OutDtype(
                f"it calls {getattr(func, '__name__', func)} with out= of dtype {out.dtype} and no dtype=: "
                f"eager computes it in {out.dtype}, a traced graph (torch's functionalization) in the "
                "result's dtype. Keep the call outside the jitted function"
            )
            raise guards.TraceStopped(self.stopped)
        written = _written_in_place(func, args, kwargs)
        if written is not None and _is_real(written):
            raise guards.SideEffect(
                f"it writes in place into a tensor it closes over (shape {list(written.shape)}, by "
                f"{getattr(func, '__name__', func)}), which compiled code would not repeat: pass that tensor "
                "as an argument, or keep the write outside the jitted function"
            )
        for value in pytree.tree_leaves((args, kwargs)):
            if isinstance(value, torch.Tensor) and _is_real(value):
                self.tensors.setdefault(id(value), value)
        func = _CHECKED.get(func, func)
        try:
            result = func(*args, **kwargs)
        except Exception as err:
            if not any(k.__name__ in _TRACER_ERRORS for k in type(err).__mro__):
                raise  # eager's own error (a shape mismatch): the function may catch it, as in eager
            self.stopped = err
            raise guards.TraceStopped(err) from err
        self._note_views(func, args, kwargs, result)
        return result

    def _note_views(self, func, args, kwargs, result) -> None:
        """Remember each view in `result` of a tensor the function closes over (or of such a view):
        returned, it comes back as a view of that tensor (capture/outputs.py `ConstantView`)."""
        given = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        results = [v for v in pytree.tree_leaves(result) if isinstance(v, torch.Tensor)]
        # (a view op views its first tensor argument, `self`; not an op writing `out=`, whose result
        # is that tensor, nor one of several results of several tensors, each viewing its own:
        # `torch.broadcast_tensors(W, y)[1]` views y)
        if not given or (kwargs and "out" in kwargs) or (len(given) > 1 and len(results) > 1):
            return
        first = given[0]
        base = first if _is_real(first) else self._views.get(id(first), (None, None))[1]
        if base is None:
            return
        for value in results:
            # (a fake tensor's view(dtype) does not say it is a view)
            if (
                value is not base
                and not any(value is t for t in given)
                and (value._is_view() or func is torch.Tensor.view)
            ):
                self._views[id(value)] = (value, base)

    def constant_base(self, value: torch.Tensor) -> torch.Tensor | None:
        """The tensor the function closes over that `value` (a tensor it returns) is a view of, if any."""
        view, base = self._views.get(id(value), (None, None))
        return base if view is value else None

    @contextlib.contextmanager
    def refusing(self):
        """Around the call of the traced function, outside its frames: a TraceStopped becomes its
        refusal, and a refusal the function swallowed (a bare `except:`) is raised all the same."""
        try:
            yield
        except guards.TraceStopped as stop:
            raise stop.refusal from None
        if self.stopped is not None:
            raise self.stopped


def _computes_in_out_dtype(func, args, kwargs) -> bool:
    """Whether `func(*args, **kwargs)` writes an `out=` tensor of another dtype than its result
    would have, through a function that takes `dtype=` (unset here): ATen's reductions and scans
    then compute in `out`'s dtype, where torch's functionalization (make_fx, AOTAutograd) calls
    the function without `out` and copies its result into it. Asked of meta copies of the
    arguments; a call it cannot ask that of is not refused."""
    out = kwargs.get("out")
    if not isinstance(out, torch.Tensor) or kwargs.get("dtype") is not None or not out.dtype.is_floating_point:
        return False  # (an integer out: summed wider and narrowed wraps as eager's sum does)
    rest = {k: v for k, v in kwargs.items() if k != "out"}
    if not any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves((args, rest))):
        return False  # a factory (torch.zeros, torch.rand): its meta call would run it for real
    from torch.utils._python_dispatch import _disable_current_modes

    try:  # (outside the trace: neither this mode nor the tracer's dispatch mode sees these calls)
        with torch._C.DisableTorchFunction(), _disable_current_modes():
            meta_args, meta_rest = pytree.tree_map_only(torch.Tensor, _on_meta, (args, rest))
            result = func(*meta_args, **meta_rest)
            func(*meta_args, **meta_rest, dtype=out.dtype)  # (a TypeError: the function takes no dtype)
    except Exception:  # noqa: BLE001 - not a call this can ask about
        return False
    return isinstance(result, torch.Tensor) and result.dtype != out.dtype


def _on_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")


# Tensor methods that read values into Python: a stand-in has none (`.numpy()` would read memory
# that holds none), and a number read would be baked into the trace
_VALUE_READS = frozenset(
    {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.__array__,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__complex__,
        torch.Tensor.__index__,
    }
)
# ops that raise for some values of their tensor arguments (an index out of range)
_INDEXING = frozenset(
    "__getitem__ __setitem__ index_select gather take take_along_dim embedding one_hot index_add index_add_ "
    "index_copy index_copy_ index_fill index_fill_ index_put index_put_ scatter scatter_ scatter_add "
    "scatter_add_ scatter_reduce scatter_reduce_".split()
)


def _one_hot(tensor, num_classes=-1):
    """F.one_hot as a scatter of ones into zeros, whose kernel checks each value as eager does
    (lowering's scatter rule raises for one outside [0, num_classes)). ATen's one_hot skips its
    checks on a traced tensor (it is an `eq` with an arange there): a value out of range gave a
    row of zeros. What eager decides from the values (num_classes=-1) or rejects stays ATen's."""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or num_classes <= 0:
        return torch.nn.functional.one_hot(tensor, num_classes)
    zeros = torch.zeros((*tensor.shape, num_classes), dtype=torch.int64, device=tensor.device)
    return zeros.scatter(-1, tensor.unsqueeze(-1), 1)


# ops whose traced form drops a check eager makes on values -> a form that keeps it
_CHECKED = {torch.nn.functional.one_hot: _one_hot}


def with_checked_forms(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` (a graph Dynamo captured) with each call of an op of `_CHECKED` calling the form that
    keeps eager's value check: on a GPU Dynamo's graph holds F.one_hot itself, which AOTAutograd
    traces to an `eq` with an arange (a value out of range gave a row of zeros)."""
    if not any(node.op == "call_function" and node.target in _CHECKED for node in gm.graph.nodes):
        return gm
    graph, values = torch.fx.Graph(), {}
    for node in gm.graph.nodes:
        copy = graph.node_copy(node, lambda n: values[n])
        if copy.op == "call_function" and copy.target in _CHECKED:
            copy.target = _CHECKED[copy.target]
        values[node] = copy
    return torch.fx.GraphModule(gm, graph)


def _fails_on_values(func, args) -> bool:
    """An op that indexes by tensor values (`x[idx]`, gather, embedding): eager may raise for them."""
    if getattr(func, "__name__", "") not in _INDEXING:
        return False
    if func.__name__ in ("__getitem__", "__setitem__"):
        index = args[1] if len(args) > 1 else None
        return any(
            isinstance(i, torch.Tensor) and i.dtype != torch.bool and not i.is_floating_point()
            for i in pytree.tree_leaves(index)
        )
    return True


_PACKAGES = tuple(os.path.join(path, "") for path in (Path(torch.__file__).parent, Path(__file__).parents[1]))


def _inside_a_try() -> bool:
    """Whether the user's code calling torch now runs inside a try block of its own that may end
    an exception (an except, a finally that returns: a plain finally or a `with` block's cleanup
    does not count), in any of its frames."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_PACKAGES[1]) and filename != __file__:  # (this file: `_CHECKED`'s forms)
            return False  # the tracer's own frames: past the traced code (a torch module's may all be torch's)
        if not filename.startswith(_PACKAGES) and _catches(frame.f_code, frame.f_lasti):
            return True
        frame = frame.f_back
    return False


@functools.cache
def _catches(code, lasti: int) -> bool:
    import dis

    parse = getattr(dis, "_parse_exception_table", None)  # (CPython 3.11+; before, no table to read)
    for entry in parse(code) if parse is not None else ():
        if entry.start <= lasti < entry.end:
            ops = code.co_code
            with_block = entry.target + 2 < len(ops) and ops[entry.target + 2] == dis.opmap["WITH_EXCEPT_START"]
            return ops[entry.target] == dis.opmap["PUSH_EXC_INFO"] and not with_block and _handles(code, entry.target)
    return False


def _handles(code, target: int) -> bool:
    """Whether the handler at `target` may end the exception: an `except` (it matches or pops the
    exception) or a `finally` that returns; a plain `finally` (transformers wraps every model's
    forward in one) runs its cleanup and raises the exception again."""
    import dis

    for ins in dis.get_instructions(code):
        if ins.offset < target:
            continue
        if ins.opname in ("CHECK_EXC_MATCH", "CHECK_EG_MATCH", "POP_EXCEPT", "RETURN_VALUE", "RETURN_CONST"):
            return True
        if ins.opname == "RERAISE":
            return False
    return True


# what the tracers raise where only tensor values (or make_fx) could go on; by name, so that
# checking imports no fake tensors
_TRACER_ERRORS = frozenset(
    {
        "Untraceable",
        "DataDependentOutputException",
        "DynamicOutputShapeException",
        "UnsupportedOperatorException",
        "GuardOnDataDependentSymNode",
    }
)


_IN_PLACE_OPERATORS = {
    f"__i{op}__" for op in "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift".split()
}


def _written_in_place(func, args, kwargs) -> torch.Tensor | None:
    """The tensor a call of torch's writes into: its `out=`, or the first argument of an in-place
    op (`add_`, `x[i] = v`, `x += v`, `F.relu(x, inplace=True)`); None for an op that writes nothing."""
    out = kwargs.get("out")
    for value in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(value, torch.Tensor):
            return value
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    name = getattr(func, "__name__", "")
    in_place = (name.endswith("_") and not name.endswith("__")) or name in _IN_PLACE_OPERATORS
    if in_place or name == "__setitem__" or kwargs.get("inplace") is True:
        return args[0]
    return None


def refuse_grad_inside(needs_grad: list[torch.Tensor], closed_over: list[torch.Tensor]) -> None:
    """A function called with grad mode off turned it on (`torch.enable_grad()`) while it had a
    tensor that requires grad: eager's result would require grad, and an inference graph
    records no autograd. Such a signature runs eagerly."""
    if needs_grad or any(t.requires_grad for t in closed_over):
        raise guards.GradModeInside(
            "it turns grad mode on inside (torch.enable_grad / set_grad_enabled) while called under "
            "no_grad with a tensor that requires grad, whose result eager records for autograd"
        )


_GRAD_HOOKS = (
    torch.Tensor.retain_grad,
    torch.Tensor.register_hook,
    torch.Tensor.register_post_accumulate_grad_hook,
)


def _is_real(value: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return not isinstance(
        value, (FakeTensor, FunctionalTensor, meta_trace.Standin)
    ) and not torch._is_functional_tensor(value)
