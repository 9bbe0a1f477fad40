"""A matmul and the row reductions after it, computed a chunk of rows at a time (issue #41).

`row_regions.py` finds, in an ATen graph, a matmul `a [N, D] @ b [D, V]` (mm or addmm) whose
large output is read only by ops that keep each row to itself (pointwise ops, views that keep
the rows, reductions and gathers along the other dims) up to small per-row results: a
cross-entropy's row losses, a logsumexp, a softmax's gathered probability. It replaces those
nodes by one call of a custom op (chunked_ops.py), naming a `Region` in this process's registry by
the hash of what it computes. Each chunk's [rows, V] product exists only while its chunk runs;
the whole product never does.

- `minicomp::chunked_rows_early`, where what reads the results up to the loss is linear in them
  (linear_tail.py): the forward computes each chunk's product once, its results, and at once
  the chunk's share of the gradients for the incoming gradients the tail gives the results
  (their `weights`, the tail's gradient at zeros). The backward scales those gradients by the
  loss's gradient: no product is made again.
- `minicomp::chunked_rows` otherwise: the forward computes the results; its backward
  (`minicomp::chunked_rows_backward`) computes each chunk's product again and backpropagates the
  chunk's share of the incoming gradients.

Per chunk, the region and its backward run as one graph (`Region.joint`: autograd traced
through the region's ATen nodes, a gather's gradient as a select: capture/one_hot.py), compiled
by minicomp.jit: one fused kernel reads the chunk's product and writes the results and the
product's gradient, no other [rows, V] value. The chunk's rows of `a`'s gradient are that
gradient times b; its share of `b`'s (and of a bias's, or of any input the rows share) is added
into one accumulator: float32 for a 16-bit vector (a bias), in place in the gradient's dtype for
a weight (cuBLAS adds each chunk's product in float32 and rounds once per chunk). A V that is
not 16 bytes whole (GPT-2's 50257) is padded with zero columns for cuBLAS's fast kernels, in b,
the bias, the product's gradient (written padded by the joint) and W's gradient buffer.

The ops are opaque to AOTAutograd (what it saves for the backward: `a`, `b` and the side inputs,
or the early gradients; no [N, V] value) and extern calls to the pipeline. Chunk size: the rows
whose [rows, V] values fit config "chunk_budget_bytes" (chunk_size.rows_a_chunk).
"""

from __future__ import annotations

import concurrent.futures
import copy
from dataclasses import dataclass, field

import torch

from minicomp import config
from minicomp.dispatch import linear_tail

REGIONS: dict[str, Region] = {}  # key -> the region the op computes (this process)

ROWS, WHOLE = "rows", "whole"  # a side input sliced by rows, or read whole by every chunk
COMPILE_ON_CPU = False  # Region.run, Region.joint
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
    tail: torch.fx.GraphModule | None = None  # (*results, *tail inputs) -> the loss: linear_tail.py
    settings: dict = field(default_factory=dict)  # config's tunables where the region was found (chunked_ops.py)
    bodies: dict[int, torch.fx.GraphModule] = field(default_factory=dict)
    compiled: dict[int, object] = field(default_factory=dict)  # run(): per rows
    joints: dict[tuple, object] = field(default_factory=dict)  # joint(): per rows, wanted sides, layouts
    weight_fns: dict[tuple, object] = field(default_factory=dict)  # tail_weights(): per tail inputs' layouts
    undonated: bool = False  # a joint kept the product beside its gradient: chunks of half the rows

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
        """The region alone (no gradient) for a chunk of `rows` rows, compiled by minicomp.jit (on
        the CPU run as traced unless COMPILE_ON_CPU)."""
        if device.type == "cpu" and not COMPILE_ON_CPU:
            return self.body(rows)
        if rows not in self.compiled:
            from minicomp.dispatch.jit import jit

            self.compiled[rows] = jit(self.body(rows).forward)
        return self.compiled[rows]

    def chunks(self):
        """(start, end) of each chunk: `rows` rows, or half as many once a joint could not write
        the product's gradient over the product (a chunk then holds two [rows, V] values: the
        budget counted one; chunk_size.rows_a_chunk)."""
        start = 0
        while start < self.n_rows:
            end = min(self.n_rows, start + (self.rows if not self.undonated else _half(self.rows)))
            yield start, end
            start = end

    def split(self, inputs: list[torch.Tensor]):
        a, b = inputs[0], inputs[1]
        bias = inputs[2] if self.bias else None
        return a, b, bias, inputs[3 if self.bias else 2 :]

    def padded(self, b: torch.Tensor, bias: torch.Tensor | None):
        """(b, bias) as the chunks' products take them: with zero columns up to `padded_width`
        where cuBLAS needs whole 16 bytes for its fast kernels (a vocabulary of 50257:
        plan/pad_matmuls.py), copied once a call; else as they are."""
        v = b.shape[1]
        width = padded_width(v, b.dtype, b.device)
        if width is None:
            return b, bias
        weight = torch.constant_pad_nd(b.t(), [0, 0, 0, width - v])  # [Vp, D]: b's transpose (a Linear's weight)
        if bias is not None and bias.shape[-1] == v:
            bias = torch.constant_pad_nd(bias, [0, width - v])
        return weight.t(), bias

    def logits(self, a, b, bias, start: int, end: int, width: int) -> torch.Tensor:
        """The chunk's product by `b` (and `bias`) from `padded`: a view of its first `width` columns."""
        rows = a[start:end]
        product = torch.mm(rows, b) if bias is None else torch.addmm(bias, rows, b)
        return product if product.shape[1] == width else product[:, :width]

    def shaped_sides(self, sides) -> list:
        """The side inputs as the chunks read them: a row side as [N, ...], the rest as they are read."""
        return [s.reshape(shape) for s, (_, shape) in zip(sides, self.sides)]

    def side_chunks(self, shaped, start: int, end: int) -> list:
        """The chunk's side inputs, from `shaped_sides`."""
        return [s[start:end] if role == ROWS else s for s, (role, _) in zip(shaped, self.sides)]

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        a, b, bias, sides = self.split(inputs)
        width, (b, bias) = b.shape[1], self.padded(b, bias)
        outs = [torch.empty(shape, dtype=dtype, device=a.device) for shape, dtype, _ in self.outputs]
        sides = self.shaped_sides(sides)
        for start, end in self.chunks():
            found = self.run(end - start, a.device)(
                self.logits(a, b, bias, start, end, width), *self.side_chunks(sides, start, end)
            )
            for out, value, (_, _, rest) in zip(outs, found, self.outputs):
                out.view(self.n_rows, *rest)[start:end].copy_(value)
        return outs

    def backward(self, inputs: list[torch.Tensor], grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """The diff inputs' gradients for the results' incoming `grads`, each chunk's product made again."""
        return self.forward_with_gradients(inputs, grads)[1]

    def forward_with_gradients(self, inputs: list[torch.Tensor], weights: list[torch.Tensor | None]):
        """(results, gradients): the forward's results, and the gradients of the diff inputs for
        incoming gradients `weights` (one per result, or None), each chunk backpropagated while its
        product is there (linear_tail.py: the caller scales them by the loss's gradient)."""
        a, b, bias, sides = self.split(inputs)
        width, (b, bias) = b.shape[1], self.padded(b, bias)
        outs = [torch.empty(shape, dtype=dtype, device=a.device) for shape, dtype, _ in self.outputs]
        rows_out = [out.view(self.n_rows, *rest) for out, (_, _, rest) in zip(outs, self.outputs)]
        result = {i: self._gradient_buffer(i, inputs[i], inputs[1].shape[1]) for i in self.diff}
        weights = [
            None if w is None else w.reshape(self.n_rows, *rest) for w, (_, _, rest) in zip(weights, self.outputs)
        ]
        operands = (a, b, self.shaped_sides(sides))
        for start, end in self.chunks():
            with torch.no_grad():
                logits = self.logits(a, b, bias, start, end, width)
            found = self._chunk_gradients(result, operands, logits, weights, start, end)
            del logits  # its memory (the chunk's gradient by then) goes before the next chunk's product
            for out, value in zip(rows_out, found):
                out[start:end] = value
        return outs, self._finished(result, inputs)

    def tail_weights(self, tail_inputs: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """The tail's gradient with respect to each result (linear in them: taken at zeros), by a
        function traced once per signature of the tail inputs (linear_tail.gradient_at_zeros)."""
        compiled = device.type != "cpu" or COMPILE_ON_CPU
        key = (device, tuple((t.dtype, t.shape, t.stride(), t.device) for t in tail_inputs), compiled)
        if key not in self.weight_fns:
            results = [(shape, dtype) for shape, dtype, _ in self.outputs]
            self.weight_fns[key] = linear_tail.gradient_at_zeros(self.tail, results, tail_inputs, device, compiled)
        return list(self.weight_fns[key](*tail_inputs))

    def _chunk_gradients(self, result: dict, operands, logits, grads, start: int, end: int) -> list[torch.Tensor]:
        """Backpropagates the rows [start, end) of `grads` (one per result, [N, ...], or None)
        through the region at the chunk's product `logits`, into `result`; the chunk's results.
        `operands`: (a, b from `padded`, the side inputs from `shaped_sides`)."""
        a, b, sides = operands
        first_side = 3 if self.bias else 2
        wanted = tuple(i - first_side for i in self.diff if i >= first_side)
        weights = [
            torch.zeros(end - start, *rest, dtype=dtype, device=a.device) if grad is None else grad[start:end]
            for grad, (_, dtype, rest) in zip(grads, self.outputs)
        ]
        args = [logits, *self.side_chunks(sides, start, end), *weights]
        joint = self.joint(end - start, wanted, b.shape[1], args)
        found = joint(*args)
        if getattr(joint, "compiled", None) is not None and not joint.taken:
            self.undonated = True
        n = len(self.outputs)
        values, d_logits, side_grads = found[:n], found[n], found[n + 1 :]
        self._matmul_grads(result, a, b, d_logits, logits.shape[1], start, end)
        for j, grad in zip(wanted, side_grads):
            i = j + first_side
            role, shape = self.sides[j]
            if role == ROWS:
                result[i].view(shape)[start:end].copy_(grad)
            elif tuple(shape) != tuple(result[i].shape):
                result[i].add_(grad.reshape(result[i].shape))
            else:
                result[i].add_(grad)
        return values

    def joint(self, rows: int, wanted: tuple[int, ...], width: int, args: list[torch.Tensor]):
        """The region and its backward as one function of (logits, *sides, *weights) -> (*results,
        logits' gradient with zero columns up to `width` (`padded`'s), *the gradients of the sides
        `wanted`), for a chunk of `rows` rows: one
        ATen graph (autograd traced through the region's nodes), compiled by minicomp with the
        logits donated (donating.py: fused kernels that write the gradient over the product, no
        other [rows, V] value; the caller reads `logits` no more) or run as traced on the CPU
        (COMPILE_ON_CPU)."""
        compiled = args[0].device.type != "cpu" or COMPILE_ON_CPU
        key = (rows, wanted, width, tuple((t.dtype, t.stride()) for t in args), compiled)
        if key not in self.joints:
            from torch.fx.experimental.proxy_tensor import make_fx

            from minicomp import capture
            from minicomp.capture import one_hot

            body, n_sides = self.body(rows), len(self.sides)

            def forward_and_backward(logits, *rest):
                sides, weights = list(rest[:n_sides]), rest[n_sides:]
                with torch.enable_grad():
                    leaves = [logits.detach().requires_grad_()]
                    for j in wanted:
                        sides[j] = sides[j].detach().requires_grad_()
                        leaves.append(sides[j])
                    values = body(leaves[0], *sides)
                    pairs = [(v, w) for v, w in zip(values, weights) if v.requires_grad]
                    got = torch.autograd.grad([v for v, _ in pairs], leaves, [w for _, w in pairs], allow_unused=True)
                got = [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, got)]
                if width != got[0].shape[1]:  # written padded by the kernel that computes it: no copy
                    got[0] = torch.constant_pad_nd(got[0], [0, width - got[0].shape[1]])
                return (*[v.detach() for v in values], *got)

            def trace():  # (on a thread of its own: see below)
                table = {**capture.decompositions(), **one_hot.table()}  # (the gather's gradient as a select)
                return make_fx(forward_and_backward, tracing_mode="fake", decomposition_table=table)(*args)

            # A custom op's kernel runs with dispatcher state (thread-local) that make_fx cannot nest in
            # (torch 2.11: an internal assert in PythonFallbackKernel); a new thread starts clean.
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                traced = pool.submit(trace).result()
            if not compiled:
                self.joints[key] = traced
            else:  # the product's gradient written over the product (a chunk holds one [rows, V] value)
                from minicomp.dispatch.donating import Donating

                self.joints[key] = Donating(traced.forward, donated=(0,), name=f"chunk_joint_{rows}")
        return self.joints[key]

    def _finished(self, result: dict, inputs) -> list[torch.Tensor]:
        """The gradients in the inputs' dtypes and shapes (a padded one as a view of its first
        columns: W's gradient, the first rows of its padded buffer, contiguous)."""
        found = [result[i][:, : inputs[i].shape[1]] if i == 1 else result[i] for i in self.diff]
        return [g.to(inputs[i].dtype) if g.dtype != inputs[i].dtype else g for i, g in zip(self.diff, found)]

    def _matmul_grads(self, result: dict, a, b, full, v: int, start: int, end: int) -> None:
        """The chunk's shares of the gradients of a (its rows), b and the bias, for the product's
        gradient: `full`, with zero columns from `v` to b's width (b from `padded`)."""
        d_logits = full[:, :v] if full.shape[1] != v else full
        if 0 in result:
            rows = result[0][start:end]
            if rows.is_contiguous():
                torch.mm(full, b.t(), out=rows)
            else:
                rows.copy_(full @ b.t())
        if 1 in result:
            x, y = a[start:end].t(), (full if result[1].shape[1] == full.shape[1] else d_logits)
            if start == 0 and result[1].dtype == x.dtype:  # the first chunk writes it: no zeros to read
                torch.mm(x, y, out=result[1])
            else:
                _add_product(result[1], x, y)
        if self.bias and 2 in result:
            if start == 0:  # the first chunk writes it: no zeros to read
                torch.sum(d_logits, 0, keepdim=result[2].ndim == 2, dtype=result[2].dtype, out=result[2])
            else:
                result[2].add_(d_logits.sum(0, keepdim=result[2].ndim == 2, dtype=result[2].dtype))

    def _gradient_buffer(self, i: int, value: torch.Tensor, width: int) -> torch.Tensor:
        """Zeros for input i's gradient: a row side's contiguous (its rows are written flat), the
        rest laid out like the input (a transposed weight's gradient comes back in the weight's
        layout: AccumulateGrad would copy one laid out otherwise). `width`: the product's V.
        Left unset where the chunks write it whole before reading it (`_matmul_grads`): a's (each
        chunk its rows), b's and the bias's summed in their own dtype (the first chunk writes them:
        for b a 1 GiB fill and a read of it less with a Llama-3 vocabulary)."""
        first_side = 3 if self.bias else 2
        dtype = self._accumulated(i, value, width)
        if i >= first_side and self.sides[i - first_side][0] == ROWS:
            return torch.zeros(value.shape, dtype=dtype, device=value.device)
        written = i == 0 or (i == 1 and dtype == value.dtype) or (i == 2 and self.bias)  # (2: a side if no bias)
        unset = written and self.n_rows > 0  # (no chunk: nothing writes it)
        padded = padded_width(value.shape[1], value.dtype, value.device) if i == 1 else None
        if padded is not None and value.stride(0) == 1:  # b = W.T: W's gradient with W's zero rows (`padded`)
            fill = _unset if unset else torch.zeros
            return fill(padded, value.shape[0], dtype=dtype, device=value.device).t()
        return (_unset_like if unset else torch.zeros_like)(value, dtype=dtype, memory_format=torch.preserve_format)

    def _accumulated(self, i: int, value: torch.Tensor, width: int) -> torch.dtype:
        """The dtype input i's gradient is summed in: float32 for a 16-bit input whose gradient
        sums over chunks (b, a bias, a side every chunk reads whole) and costs no more than a row
        of the product (a bias's, a vector side's); a weight's is summed in place in its own
        dtype (cuBLAS adds each chunk's product in float32 and rounds once per chunk): a float32
        copy of it would outweigh the chunks the budget allows."""
        first_side = 3 if self.bias else 2
        sums = i in (1, 2) if i < first_side else self.sides[i - first_side][0] == WHOLE
        one_chunk = self.rows >= self.n_rows and not self.undonated  # (rounded once by its sum alone)
        if sums and not one_chunk and value.dtype in (torch.float16, torch.bfloat16) and value.numel() <= width:
            return torch.float32
        return value.dtype


def _unset(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Memory a chunk's product writes whole before anything reads it."""
    return torch.empty(*shape, dtype=dtype, device=device)


def _unset_like(value: torch.Tensor, dtype: torch.dtype, memory_format: torch.memory_format) -> torch.Tensor:
    return torch.empty_like(value, dtype=dtype, memory_format=memory_format)


def _half(rows: int) -> int:
    """Half of `rows`, whole tiles of 128 rows where it has them."""
    half = max(1, rows // 2)
    return half // 128 * 128 if half >= 128 else half


def padded_width(v: int, dtype: torch.dtype, device: torch.device) -> int | None:
    """The row length, 16 bytes whole, a [rows, v] matmul operand or result gets for cuBLAS's fast
    kernels (plan/pad_matmuls.py), or None where v is aligned already or config "pad_matmuls" pads
    nothing here ("auto": CUDA only)."""
    from minicomp.plan.pad_matmuls import ALIGNMENT

    align, mode = ALIGNMENT.get(dtype), config.get("pad_matmuls")
    if not align or v % align == 0 or mode == "never" or (mode == "auto" and device.type != "cuda"):
        return None
    return -(-v // align) * align


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
