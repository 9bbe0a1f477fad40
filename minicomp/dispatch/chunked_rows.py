"""A matmul and the row reductions after it, computed a chunk of rows at a time (issue #41).

`row_regions.py` finds, in an ATen graph, a matmul `a [N, D] @ b [D, V]` (mm or addmm) whose
large output is read only by ops that keep each row to itself (pointwise ops, views that keep
the rows, reductions and gathers along the other dims) up to small per-row results: a
cross-entropy's row losses, a logsumexp, a softmax's gathered probability. It replaces those
nodes by one call of the custom op `minicomp::chunked_rows` defined here, a `Region` in this
process's registry named by the hash of what it computes. Its forward computes the matmul and
the region for `rows` rows at a time and writes each chunk's results; the [N, V] product
never exists whole. Its backward (`minicomp::chunked_rows_backward`) computes each chunk's
product again, backpropagates the chunk's share of the incoming gradients through the region
(autograd on the region's ATen nodes), writes the chunk's rows of `a`'s gradient and adds the
chunk's share of `b`'s (and of a bias's, or of any input the rows share) into one
accumulator: in float32 for 16-bit values where that accumulator fits the budget, else in
place in the gradient's dtype (cuBLAS adds each chunk's product in float32 and rounds once per
chunk). Both are opaque ops to AOTAutograd (what it saves for the backward is `a`, `b` and the
region's side inputs: no [N, V] value) and extern calls to the pipeline.

Chunk size: the rows whose widest region value and its gradient fit config
"chunk_budget_bytes" (row_regions.chunk_rows).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

REGIONS: dict[str, Region] = {}  # key -> the region the op computes (this process)

ROWS, WHOLE = "rows", "whole"  # a side input sliced by rows, or read whole by every chunk
COMPILE_ON_CPU = False  # Region.run
SIZED = {"view", "_unsafe_view", "reshape", "expand"}  # ops whose size argument holds the row count


@dataclass
class Region:
    """What one `chunked_rows` call computes. `template`: the region's ATen nodes as a graph of
    (logits, *sides), every value with its rows flattened into one leading dim (a [B, S, V]
    value is [B * S, V] there; dims shifted to match), each size argument's trailing dims in
    its `meta["row_rest"]`; `sides`: (role, shape) of each side input: ROWS, sliced as `shape`
    [N, ...]; WHOLE, read as `shape`; `outputs`: (shape, dtype, rest) of each row result;
    `diff`: which inputs (a, b, bias?, *sides) get a gradient."""

    template: torch.fx.GraphModule
    n_rows: int
    rows: int  # rows a chunk
    bias: bool  # addmm: inputs are a, b, bias, *sides
    sides: list[tuple[str, int]]
    outputs: list[tuple[tuple[int, ...], torch.dtype, int]]
    diff: list[int]
    budget: int
    bodies: dict[int, torch.fx.GraphModule] = field(default_factory=dict)
    compiled: dict[int, object] = field(default_factory=dict)

    def body(self, rows: int) -> torch.fx.GraphModule:
        """The region for a chunk of `rows` rows: the template with each size argument's leading
        dim for that many rows."""
        if rows not in self.bodies:
            graph = copy.deepcopy(self.template.graph)
            for node in graph.nodes:
                rest = node.meta.get("row_rest")
                if node.op == "call_function" and rest is not None:
                    node.args = (node.args[0], [rows, *rest], *node.args[2:])
            self.bodies[rows] = torch.fx.GraphModule(self.template, graph)
        return self.bodies[rows]

    def run(self, rows: int, device: torch.device):
        """The region for a chunk of `rows` rows compiled by minicomp (minicomp.jit: fused
        kernels, a backward of its own; a chunk it cannot compile runs its ATen nodes eagerly, by
        the fallback policy). On the CPU (Triton's interpreter) the ATen nodes run eagerly unless
        COMPILE_ON_CPU: the tests compare both with eager."""
        if device.type == "cpu" and not COMPILE_ON_CPU:
            return self.body(rows)
        if rows not in self.compiled:
            from minicomp.dispatch.jit import jit

            self.compiled[rows] = jit(self.body(rows).forward)
        return self.compiled[rows]

    def chunks(self):
        for start in range(0, self.n_rows, self.rows):
            yield start, min(self.n_rows, start + self.rows)

    def split(self, inputs: list[torch.Tensor]):
        a, b = inputs[0], inputs[1]
        bias = inputs[2] if self.bias else None
        return a, b, bias, inputs[3 if self.bias else 2 :]

    def logits(self, a, b, bias, start: int, end: int) -> torch.Tensor:
        rows = a[start:end]
        return torch.mm(rows, b) if bias is None else torch.addmm(bias, rows, b)

    def side_chunks(self, sides, start: int, end: int) -> list:
        return [
            s.reshape(shape)[start:end] if role == ROWS else s.reshape(shape)
            for s, (role, shape) in zip(sides, self.sides)
        ]

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        a, b, bias, sides = self.split(inputs)
        outs = [torch.empty(shape, dtype=dtype, device=a.device) for shape, dtype, _ in self.outputs]
        for start, end in self.chunks():
            found = self.run(end - start, a.device)(
                self.logits(a, b, bias, start, end), *self.side_chunks(sides, start, end)
            )
            for out, value, (_, _, rest) in zip(outs, found, self.outputs):
                out.view(self.n_rows, *rest)[start:end].copy_(value)
        return outs

    def backward(self, inputs: list[torch.Tensor], grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
        a, b, bias, sides = self.split(inputs)
        first_side = 3 if self.bias else 2
        result = {i: self._gradient_buffer(i, inputs[i]) for i in self.diff}
        for start, end in self.chunks():
            chunk_sides = self.side_chunks(sides, start, end)
            with torch.no_grad():
                logits = self.logits(a, b, bias, start, end)
            leaves = [logits.requires_grad_()]
            wanted = [i for i in self.diff if i >= first_side]
            for i in wanted:
                chunk_sides[i - first_side] = chunk_sides[i - first_side].detach().requires_grad_()
                leaves.append(chunk_sides[i - first_side])
            with torch.enable_grad(), _autograd_on():
                found = self.run(end - start, a.device)(*leaves[:1], *chunk_sides)
                pairs = [
                    (value, grad.reshape(self.n_rows, *rest)[start:end])
                    for value, grad, (_, _, rest) in zip(found, grads, self.outputs)
                    if grad is not None and value.requires_grad
                ]
                got = (
                    torch.autograd.grad([v for v, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
                    if pairs
                    else [None] * len(leaves)
                )
            d_logits = got[0]
            if d_logits is not None:
                self._matmul_grads(result, a, b, d_logits, start, end)
            for i, grad in zip(wanted, got[1:]):
                if grad is None:
                    continue
                role, shape = self.sides[i - first_side]
                if role == ROWS:
                    result[i].view(shape)[start:end].copy_(grad)
                elif tuple(shape) != tuple(result[i].shape):
                    result[i].add_(grad.reshape(result[i].shape))
                else:
                    result[i].add_(grad)
        return [result[i].to(inputs[i].dtype) if result[i].dtype != inputs[i].dtype else result[i] for i in self.diff]

    def _matmul_grads(self, result: dict, a, b, d_logits, start: int, end: int) -> None:
        if 0 in result:
            rows = result[0][start:end]
            if rows.is_contiguous():
                torch.mm(d_logits, b.t(), out=rows)
            else:
                rows.copy_(d_logits @ b.t())
        if 1 in result:
            _add_product(result[1], a[start:end].t(), d_logits)
        if self.bias and 2 in result:
            result[2].add_(d_logits.sum(0, dtype=result[2].dtype))

    def _gradient_buffer(self, i: int, value: torch.Tensor) -> torch.Tensor:
        """Zeros for input i's gradient: a row side's contiguous (its rows are written flat), the
        rest laid out like the input (a transposed weight's gradient comes back in the weight's
        layout: AccumulateGrad would copy one laid out otherwise)."""
        first_side = 3 if self.bias else 2
        dtype = self._accumulated(i, value)
        if i >= first_side and self.sides[i - first_side][0] == ROWS:
            return torch.zeros(value.shape, dtype=dtype, device=value.device)
        return torch.zeros_like(value, dtype=dtype, memory_format=torch.preserve_format)

    def _accumulated(self, i: int, value: torch.Tensor) -> torch.dtype:
        """The dtype input i's gradient is summed in: float32 for a 16-bit input whose gradient
        sums over chunks (b, a bias, a side every chunk reads whole), when that fits the budget."""
        first_side = 3 if self.bias else 2
        sums = i in (1, 2) if i < first_side else self.sides[i - first_side][0] == WHOLE
        if sums and value.dtype in (torch.float16, torch.bfloat16) and 4 * value.numel() <= self.budget:
            return torch.float32
        return value.dtype


def _add_product(total: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
    """total += x @ y in place, without a product-sized temporary where the device can."""
    if total.dtype == x.dtype:
        total.addmm_(x, y)
        return
    if total.is_cuda:
        try:
            torch.ops.aten.addmm.dtype_out(total, x, y, total.dtype, out=total)
            return
        except (RuntimeError, NotImplementedError):  # an older torch: the product, then the sum
            pass
    total.add_(torch.mm(x.to(total.dtype), y.to(total.dtype)))


class _autograd_on:
    """Autograd inside a custom op's kernel: torch runs a custom op's implementation with the
    autograd keys excluded (below autograd), and the backward differentiates the region's nodes."""

    def __enter__(self):
        self.guard = torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.AutogradFunctionality, False)
        self.guard.__enter__()

    def __exit__(self, *exc):
        return self.guard.__exit__(*exc)


def _region(key: str) -> Region:
    try:
        return REGIONS[key]
    except KeyError:
        raise RuntimeError(
            f"minicomp::chunked_rows region {key} is not known in this process (it is registered when "
            "the graph that uses it is compiled)"
        ) from None


@torch.library.custom_op("minicomp::chunked_rows", mutates_args=())
def chunked_rows(inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    """The row results of region `key` over inputs (a, b, bias?, *sides), a chunk at a time."""
    return _region(key).forward(inputs)


@chunked_rows.register_fake
def _chunked_rows_fake(inputs, key):
    device = inputs[0].device
    return [inputs[0].new_empty(shape, dtype=dtype, device=device) for shape, dtype, _ in _region(key).outputs]


@torch.library.custom_op("minicomp::chunked_rows_backward", mutates_args=())
def chunked_rows_backward(inputs: list[torch.Tensor], grads: list[torch.Tensor | None], key: str) -> list[torch.Tensor]:
    """The gradients of region `key`'s differentiable inputs, a chunk at a time."""
    return _region(key).backward(inputs, grads)


@chunked_rows_backward.register_fake
def _chunked_rows_backward_fake(inputs, grads, key):
    region = _region(key)
    first_side = 3 if region.bias else 2
    return [
        inputs[i].new_empty(inputs[i].shape)
        if i >= first_side and region.sides[i - first_side][0] == ROWS
        else torch.empty_like(inputs[i], memory_format=torch.preserve_format)
        for i in region.diff
    ]


def _setup_context(ctx, inputs, output):
    tensors, key = inputs
    ctx.save_for_backward(*tensors)
    ctx.key = key


def _backward(ctx, grads):
    region = _region(ctx.key)
    inputs = list(ctx.saved_tensors)
    found = chunked_rows_backward(inputs, list(grads), ctx.key) if region.diff else []
    result: list = [None] * len(inputs)
    for i, grad in zip(region.diff, found):
        result[i] = grad
    return result, None


def _no_double_backward(ctx, *grads):
    raise RuntimeError(
        "minicomp::chunked_rows_backward is not differentiable (a double backward through a chunked loss)"
    )


chunked_rows.register_autograd(_backward, setup_context=_setup_context)
chunked_rows_backward.register_autograd(_no_double_backward)
