"""Where the chunked-loss rewrite (row_regions.py, issue #41) meets the two compile paths: the
ATen graph it reads, traced from a Dynamo graph (dynamo.py's backend: `dynamo_graph`) or from
jit's training function (autograd.py: `Chunkable`, then `training_function`), and handed on
rewritten, or the input left as it came where there is nothing to chunk or the trace would lose
something (a grad-mode switch, autocast, a detach: lost_in_trace.py)."""

from __future__ import annotations

import torch
import torch.fx

from minicomp import config
from minicomp.dispatch import row_regions
from minicomp.dispatch.lost_in_trace import stateful

log = row_regions.log


class Chunkable(Exception):
    """Raised by jit's forward compiler (autograd.py) for a graph with a matmul over the budget:
    the function is traced again, with its regions rewritten (training_function)."""


def has_large_matmul(gm: torch.fx.GraphModule) -> bool:
    """Whether an ATen graph has a matmul whose product (with its gradient) is over the budget."""
    budget = config.get("chunk_budget_bytes")
    return bool(budget) and any(row_regions.is_large_matmul(n, budget) for n in gm.graph.nodes)


def training_function(aot, parts, tensors: list[torch.Tensor]):
    """(function, chunked) for jit's training path (autograd.py): AOTAutograd's function of the ATen
    graph of `flat_fn` with its regions rewritten, or of `flat_fn` itself where it has none.
    `aot(fn, compile_forward, compile_backward)` builds one; `parts` is (flat_fn, compile_forward,
    compile_backward)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    flat_fn, compile_forward, compile_backward = parts
    rewritten = None
    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fakes = [mode.from_tensor(t) for t in tensors]
        if _switches_modes(flat_fn, fakes, mode):  # a trace to ATen would lose a no_grad block
            log.info("not chunked: the function switches grad mode or autocast, or detaches a value")
            return aot(flat_fn, compile_forward, compile_backward), False
        aten = _aten_graph(flat_fn, fakes, mode)
        rewritten = row_regions.rewrite(aten, [t.requires_grad for t in tensors])
    except Exception as err:  # noqa: BLE001 - traced as it is
        log.info("not chunked: tracing to ATen failed: %s", err)
    if rewritten is None:
        return aot(flat_fn, compile_forward, compile_backward), False
    return aot(rewritten, compile_forward, compile_backward), True


def _switches_modes(fn, fakes, fake_mode) -> bool:
    """Whether `fn` switches grad mode or autocast: a pre-dispatch trace keeps those switches as
    nodes (`stateful`), where the ATen trace the rewrite reads drops them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with fake_mode:
        return stateful(make_fx(fn, pre_dispatch=True)(*fakes), [getattr(f, "requires_grad", False) for f in fakes])


_PRODUCTS = {
    "linear",
    "matmul",
    "mm",
    "addmm",
    "__matmul__",
    "bmm",
}  # the matmuls of a Dynamo graph (operator.matmul too)


def worth_tracing(gm: torch.fx.GraphModule) -> bool:
    """A cheap look at a Dynamo graph before tracing it to ATen: some product by a matrix (a
    linear, `h @ W.T`) makes a value over the budget."""
    budget = config.get("chunk_budget_bytes")
    if not budget or stateful(gm):
        return False
    for node in gm.graph.nodes:
        val = node.meta.get("example_value")
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if node.op in ("call_function", "call_method") and name in _PRODUCTS and isinstance(val, torch.Tensor):
            other = node.args[1] if len(node.args) > 1 else None
            weight = other.meta.get("example_value") if isinstance(other, torch.fx.Node) else None
            if getattr(weight, "ndim", 0) == 2 and 2 * val.numel() * val.dtype.itemsize > budget:
                return True  # (a product by a matrix: attention's batched products are not traced for this)
    return False


def dynamo_graph(gm: torch.fx.GraphModule, example_inputs) -> torch.fx.GraphModule:
    """The ATen graph of Dynamo graph `gm` with its chunkable regions rewritten, or `gm` itself
    when it has none (or it cannot tell)."""
    if not worth_tracing(gm):
        return gm
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(example_inputs)
    symbolic = any(
        isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and any(not isinstance(d, int) for d in x.shape))
        for x in example_inputs
    )
    autocast = any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))  # (AOTAutograd applies it)
    if fake_mode is None or symbolic or autocast:
        return gm
    try:
        aten = _aten_graph(gm, example_inputs, fake_mode)
        grad = torch.is_grad_enabled()  # (Dynamo guards on it: no gradient is wanted from a graph traced without)
        requires_grad = [grad and isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs]
        rewritten = row_regions.rewrite(aten, requires_grad)
    except Exception as err:  # noqa: BLE001 - the graph goes on as Dynamo captured it
        log.info("not chunked: tracing to ATen failed: %s", err)
        return gm
    return gm if rewritten is None else rewritten


def _aten_graph(fn, example_inputs, fake_mode) -> torch.fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicomp import capture

    fakes = [
        fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) else x
        for x in example_inputs
    ]
    from minicomp.capture.functional import functional_temporaries, writes_in_place

    table = capture.decompositions() | _SHIFTED_BY_A_DETACHED_MAX
    with fake_mode:
        gm = functional_temporaries(make_fx(torch.func.functionalize(fn), decomposition_table=table)(*fakes))
        if writes_in_place(gm):  # a decomposition's write (label smoothing's masked_fill_): traced functional
            with torch.no_grad():
                gm = functional_temporaries(make_fx(torch.func.functionalize(gm), decomposition_table=table)(*fakes))
    for node in gm.graph.nodes:  # aten.copy (a functional copy_) has no derivative
        if node.op == "call_function" and node.target is torch.ops.aten.copy.default and len(node.args) == 2:
            node.target = row_regions.copy_like
        elif node.op == "call_function" and node.target is torch.ops.minicomp.unshifting.default:
            node.target = torch.ops.aten.detach.default  # (functionalization would have made a detach an alias)
    gm.recompile()
    return gm


# The softmax family as the chunks trace it: autograd runs over these ops (the rows' gradient is
# the regions' backward), so the maximum that shifts the rows is detached. Its gradient, a count
# of each row's ties, is zero in exact arithmetic (the shift cancels), and costs the joint kernel a
# pass over the logits (docs/experiments.md); eager's own derivatives of these ops have no such term.


@torch.library.custom_op("minicomp::unshifting", mutates_args=())
def _unshifting(x: torch.Tensor) -> torch.Tensor:
    """A detach that survives functionalization, as a node `_aten_graph` turns into aten.detach
    (traced only, never run)."""
    return x.detach().clone()


@_unshifting.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _shift(x: torch.Tensor, dims) -> torch.Tensor:
    return torch.amax(_unshifting(x), dims, keepdim=True)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in its computation dtype: float32 for 16-bit floats, as eager's kernels compute."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _log_softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    x = x.contiguous()
    wide = _wide(x)
    shifted = wide - _shift(wide, dim)
    result = shifted - torch.log(torch.sum(torch.exp(shifted), dim, keepdim=True))
    return result if half_to_float else result.to(x.dtype)


def _softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    x = x.contiguous()
    wide = _wide(x)
    unnormalized = torch.exp(wide - _shift(wide, dim))
    result = unnormalized / torch.sum(unnormalized, dim, keepdim=True)
    return result if half_to_float else result.to(x.dtype)


def _logsumexp(x: torch.Tensor, dim, keepdim: bool = False) -> torch.Tensor:
    from torch._decomp import decomposition_table

    dims = tuple(dim) if isinstance(dim, (list, tuple)) else (dim,)
    if not x.is_floating_point() or x.numel() == 0:
        return decomposition_table[torch.ops.aten.logsumexp.default](x, dims, keepdim)
    maxes = _shift(x, dims)
    maxes = torch.masked_fill(maxes, maxes.abs() == float("inf"), 0)
    summed = torch.sum(torch.exp(x - maxes), dims, keepdim)
    return summed.log().add(maxes if keepdim else torch.squeeze(maxes, dims))


_SHIFTED_BY_A_DETACHED_MAX = {
    torch.ops.aten._log_softmax.default: _log_softmax,
    torch.ops.aten._softmax.default: _softmax,
    torch.ops.aten.logsumexp.default: _logsumexp,
}
