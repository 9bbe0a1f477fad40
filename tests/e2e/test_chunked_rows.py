"""A matmul whose product only row reductions read, computed by chunks of rows (issue #41).

Each loss form (cross-entropy with ignored rows, label smoothing, reductions sum/mean/none,
z-loss, soft-capping; logsumexp; softmax then gather; a bf16 product upcast; a linear with a
bias over a [B, S, D] batch) through `torch.compile(backend="minicomp")` and minicomp.jit's
training path with a tiny "chunk_budget_bytes" (5 chunks): the value and the gradients of h
and W against eager, a `minicomp::chunked_rows` call in the forward graph and its backward in
the backward graph, no value of N * V elements in either graph nor in the chunks' ops. Products
read otherwise (returned, summed over rows) are left whole.
"""

from __future__ import annotations

import math
import weakref
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import minicomp
from minicomp import config, pipeline
from minicomp.dispatch import chunk_size, chunk_tracing, chunked_rows, donating, dynamo, row_regions

N, D, V = 37, 16, 103
BUDGET = 2 * 8 * V * 4  # about 8 rows of float32 logits and their gradient: 5 chunks


class Largest(TorchDispatchMode):
    """The largest tensor any op returns while it is on."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def _inputs(dtype=torch.float32, batch=None):
    torch.manual_seed(0)
    shape = (N, D) if batch is None else (batch, N // batch, D)
    h = torch.randn(*shape, dtype=dtype, requires_grad=True)
    W = (torch.randn(V, D) / 4).to(dtype).requires_grad_()
    y = torch.randint(0, V, shape[:-1])
    y.view(-1)[[3, 11, 20]] = -100  # ignored rows
    return h, W, y


def _check(fn, inputs, atol=1e-5, rtol=1e-4, rows=N, how="dynamo", grad=3.0):
    """fn through the backend (or minicomp.jit, how="jit") against eager (NaN where eager's is), with
    an incoming gradient of `grad`; the graphs minicomp compiles and the chunks' ops never hold a
    value of N * V elements. A scalar loss (a linear tail: linear_tail.py) has its gradients made
    in the forward, by one `chunked_rows_early` call; any other result by a `chunked_rows` call
    and its backward."""
    h, W = inputs[:2]
    ref = fn(*inputs)
    ref_grads = torch.autograd.grad(ref, [h, W], torch.full_like(ref, grad))
    graphs, seen = [], Largest()
    compile_graph = pipeline.compile_graph

    def recording(gm, *args, **kwargs):
        graphs.append(gm)
        return compile_graph(gm, *args, **kwargs)

    def watched(method):
        def run(self, *args):
            with seen:
                return method(self, *args)

        return run

    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as patch, config.override(chunk_budget_bytes=BUDGET):
        patch.setattr(dynamo, "compile_graph", recording)
        patch.setattr(pipeline, "compile_graph", recording)  # (jit's training path imports it when it compiles)
        compiled = torch.compile(fn, backend=dynamo.backend) if how == "dynamo" else minicomp.jit(fn, fallback="raise")
        out = compiled(*inputs)  # compiles the graphs and each chunk's region (minicomp.jit)
        torch.autograd.grad(out, [h, W], torch.full_like(out, grad))
        for method in ("forward", "backward", "forward_with_gradients"):
            patch.setattr(chunked_rows.Region, method, watched(getattr(chunked_rows.Region, method)))
        out = compiled(*inputs)
        grads = torch.autograd.grad(out, [h, W], torch.full_like(out, grad))
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol, equal_nan=True)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)
    assert len(graphs) >= 2  # forward and backward (and the chunks' regions where minicomp.jit compiles them)
    calls = sorted(str(n.target) for gm in graphs for n in gm.graph.nodes if "chunked_rows" in str(n.target))
    if out.numel() == 1:
        assert calls == ["minicomp.chunked_rows_early.default"], "gradients made in the forward"
    else:
        assert calls == ["minicomp.chunked_rows.default", "minicomp.chunked_rows_backward.default"]
    for gm in graphs:
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            assert not isinstance(val, torch.Tensor) or val.numel() < rows * V, f"{node.name} {tuple(val.shape)}"
    assert 0 < seen.numel < rows * V, f"a tensor of {seen.numel} elements inside the chunks"
    return out


def ce_ignore(h, W, y):
    return F.cross_entropy(h @ W.T, y, ignore_index=-100)


def ce_smoothing(h, W, y):
    return F.cross_entropy(h @ W.T, y, label_smoothing=0.1)


def ce_sum(h, W, y):
    return F.cross_entropy(h @ W.T, y, reduction="sum")


def ce_none(h, W, y):
    return F.cross_entropy(h @ W.T, y, reduction="none")


def ce_z_loss(h, W, y):
    logits = h @ W.T
    return F.cross_entropy(logits, y) + 1e-2 * torch.logsumexp(logits, -1).pow(2).mean()


def ce_soft_cap(h, W, y):
    return F.cross_entropy(30 * torch.tanh((h @ W.T) / 30), y)


def logsumexp_rows(h, W, y):
    return torch.logsumexp(h @ W.T, dim=-1)


def softmax_gather(h, W, y):
    probs = torch.softmax(h @ W.T, dim=-1)
    return -probs.gather(1, y.clamp_min(0)[:, None]).log().mean()


@pytest.mark.parametrize(
    "fn", [ce_ignore, ce_smoothing, ce_sum, ce_none, ce_z_loss, ce_soft_cap, logsumexp_rows, softmax_gather]
)
def test_loss_forms(fn):
    _check(fn, _inputs())


@pytest.mark.parametrize("fn", [ce_ignore, ce_smoothing, ce_none, ce_z_loss, softmax_gather])
def test_loss_forms_through_jit(fn):
    """minicomp.jit's training path: the first trace finds the large product, the function is
    traced again with it chunked (chunk_tracing.training_function); later calls (the lean path)
    give the same."""
    _check(fn, _inputs(), how="jit")


def _compiled_joints(monkeypatch) -> list:
    """The chunks' joints (donating.Donating) made from now on, compiled on the CPU as on a GPU."""
    monkeypatch.setattr(chunked_rows, "COMPILE_ON_CPU", True)
    made = []
    init = donating.Donating.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(donating.Donating, "__init__", recording)
    return made


@pytest.mark.slow  # each chunk size's region compiled (forward, training) in the interpreter: ~7 s
@pytest.mark.parametrize(
    "fn, pad",
    [(ce_smoothing, "auto"), (ce_none, "auto"), (ce_ignore, "always")]
    + [(fn, "auto") for fn in (ce_sum, ce_z_loss, ce_soft_cap, logsumexp_rows, softmax_gather)],
)
def test_chunks_compiled_by_minicomp(fn, pad, monkeypatch, own_regions):
    """Each chunk's region and its backward compiled by minicomp (what the GPU runs), not run
    eagerly: one kernel writes the product's gradient over the product (donating.py), so a chunk
    holds one [rows, V] value; padded for cuBLAS (V = 103 -> 104), inside the padded product."""
    made = _compiled_joints(monkeypatch)
    with config.override(pad_matmuls=pad):
        _check(fn, _inputs())
    undonated = [region for region in own_regions.values() if region.undonated]
    assert made and all(joint.compiled is not None for joint in made), "each chunk size's joint compiled"
    for joint in made:
        gradient = joint.compiled.graph.outputs[-1]  # (results, the product's gradient): no side needs one
        over = "over_or_empty(donated_0" if pad == "always" else "reinterpret(donated_0, "
        assert f"{gradient} = {over}" in joint.compiled.source and joint.taken, joint.compiled.source
    assert not undonated  # (a gather of the target's value runs before the gradient's pass)


def test_the_softmax_familys_shift_is_detached_in_the_traced_region():
    """The chunks' ATen graph shifts each row by a detached max (chunk_tracing.py): autograd over
    the region then computes no tie count for `amax`, which a joint kernel paid a pass for."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for fn in (ce_sum, logsumexp_rows, softmax_gather):
        gm = chunk_tracing._aten_graph(fn, list(_inputs()), FakeTensorMode(allow_non_fake_inputs=True))
        maxes = [n for n in gm.graph.nodes if n.target is torch.ops.aten.amax.default]
        assert maxes and all(n.args[0].target is torch.ops.aten.detach.default for n in maxes), gm.code


@pytest.mark.slow  # the joints compiled in the interpreter
@pytest.mark.parametrize("fn, passes", [(ce_sum, 2), (ce_smoothing, 2), (logsumexp_rows, 3), (softmax_gather, 3)])
def test_a_joint_kernel_passes_over_its_rows(fn, passes, monkeypatch, own_regions):
    """Walking its rows in blocks (a looped reduction, as a vocabulary of 128k is), a chunk's joint
    kernel makes one pass for the max and the sum of exponentials (online), one for the gradient
    (and one for each further row reduction the form needs), and writes the gradient over the
    product: the target's value is gathered before the gradient's pass (codegen/reduction.py,
    written_over.py). Before: a tie-count pass more, and softmax-then-gather not in place."""
    made = _compiled_joints(monkeypatch)
    with config.override(persistent_rows=32, persistent_bytes=64):
        _check(fn, _inputs())
    source = made[0].compiled.source
    assert source.count("for roffset in range(") == passes, source
    assert made[0].taken


def test_chunks_of_half_the_rows_where_the_gradient_is_not_over_the_product():
    region = chunked_rows.Region(None, n_rows=1000, rows=256, bias=False, sides=[], outputs=[], diff=[], budget=0)
    assert [end - start for start, end in region.chunks()] == [256, 256, 256, 232]
    region.undonated = True
    assert [end - start for start, end in region.chunks()] == [128] * 7 + [104]


@pytest.mark.parametrize(
    "n, most, rows",
    [(4096, 1280, 1024), (4000, 1280, 1024), (8192, 523, 512), (37, 8, 8), (100, 7, 7), (4096, 4095, 2048)],
)
def test_chunks_of_even_rows(n, most, rows):
    """The fewest chunks the budget allows, of equal rows (whole row tiles of 128 where the budget
    allows one): no chunk a small remainder (GPT-2's 4096 rows at 1280: 4 of 1024, not 1280 x 3 + 256)."""
    assert chunk_size.even_rows(n, most) == rows
    assert rows <= max(most // 128 * 128, 1) if most >= 128 else rows <= most


def test_one_chunk_product_alive_at_a_time(monkeypatch):
    """A chunk's product (its memory holding the chunk's gradient once the joint ran) is gone
    before the next chunk's product is made: the budget's one [rows, V] value at a time."""
    monkeypatch.setattr(chunked_rows, "COMPILE_ON_CPU", True)
    products, make = [], chunked_rows.Region.logits

    def logits(self, *args):
        assert all(product() is None for product in products), "an earlier chunk's product is still held"
        product = make(self, *args)
        products.append(weakref.ref(product))
        return product

    monkeypatch.setattr(chunked_rows.Region, "logits", logits)
    _check(ce_ignore, _inputs())
    assert len(products) > 5


@pytest.mark.parametrize("pad", ["never", "always"])
def test_the_first_chunk_writes_the_weights_gradient(monkeypatch, pad):
    """W's gradient is not zero-filled then added to: its buffer starts as whatever memory holds
    (NaN here) and the first chunk's product writes all of it, the padded rows included."""
    made = []

    def dirty(*shape, dtype, device):
        made.append(torch.full(shape, float("nan"), dtype=dtype, device=device))
        return made[-1]

    def dirty_like(value, dtype, memory_format):
        made.append(torch.full_like(value, float("nan"), dtype=dtype, memory_format=memory_format))
        return made[-1]

    monkeypatch.setattr(chunked_rows, "_unset", dirty)
    monkeypatch.setattr(chunked_rows, "_unset_like", dirty_like)
    with config.override(pad_matmuls=pad):
        _check(ce_smoothing, _inputs())
    assert any(t.numel() >= V * D for t in made), "W's gradient buffer was not left unset"


def test_bf16_logits_upcast():
    def fn(h, W, y):
        return F.cross_entropy((h @ W.T).float(), y)

    h, W, y = _inputs(torch.bfloat16)
    _check(fn, (h, W, y), atol=2e-2, rtol=2e-2)


def test_linear_with_bias_over_a_batch():
    bias = torch.randn(V, requires_grad=True)

    def fn(h, W, y):
        logits = F.linear(h, W, bias)
        return F.cross_entropy(logits.view(-1, V), y.view(-1), label_smoothing=0.05)

    h, W, y = _inputs()  # [3, 12] rows: chunks of 8 rows cut a sequence
    h, y = h.detach()[:36].view(3, 12, D).requires_grad_(), y[:36].view(3, 12)
    _check(fn, (h, W, y), rows=36)
    ref = torch.autograd.grad(fn(h, W, y), bias)[0]
    with config.override(chunk_budget_bytes=BUDGET):
        got = torch.autograd.grad(torch.compile(fn, backend=dynamo.backend)(h, W, y), bias)[0]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


class Fills(TorchDispatchMode):
    """The ops that fill memory with a constant while it is on, outside the chunks' joints."""

    FILLS = {"zeros", "zeros_like", "zero_", "fill_", "new_zeros", "full", "full_like"}

    def __init__(self):
        super().__init__()
        self.found, self.paused = [], False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and func.__name__.split(".")[0] in self.FILLS:
            self.found.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows", [36, 8])  # one chunk, five
def test_gradient_buffers_the_chunks_write_whole_are_not_filled(monkeypatch, rows):
    """a's gradient (each chunk writes its rows), b's and the bias's (the first chunk writes them)
    start unset: the chunk loop fills no memory but a row side's gradient (none here)."""
    bias = torch.randn(V, requires_grad=True)
    h, W, y = _inputs()
    h, y = h.detach()[:36].requires_grad_(), y[:36]

    def fn(h, W, bias, y):
        return F.cross_entropy(F.linear(h, W, bias), y)

    fills, joint = Fills(), chunked_rows.Region.joint

    def paused(self, *args):
        run = joint(self, *args)

        def call(*values):
            fills.paused = True
            try:
                return run(*values)
            finally:
                fills.paused = False

        call.compiled, call.taken = getattr(run, "compiled", None), getattr(run, "taken", False)
        return call

    monkeypatch.setattr(chunked_rows.Region, "joint", paused)
    monkeypatch.setattr(chunk_size, "rows_a_chunk", lambda nodes, n, budget: rows)
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        compiled = torch.compile(fn, backend=dynamo.backend)
        compiled(h, W, bias, y)
        forward = chunked_rows.Region.forward_with_gradients

        def watched(self, *args):
            with fills:
                return forward(self, *args)

        monkeypatch.setattr(chunked_rows.Region, "forward_with_gradients", watched)
        got = torch.autograd.grad(compiled(h, W, bias, y), [h, W, bias])
    assert fills.found == []
    want = torch.autograd.grad(fn(h, W, bias, y), [h, W, bias])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def _class_offset(h, W, c, y):
    return F.cross_entropy(h @ W.T + c, y)  # c [V]: a side every chunk reads whole, with a gradient


def _linear_bias(h, W, c, y):
    return F.cross_entropy(F.linear(h, W, c), y)


@pytest.mark.parametrize("fn", [_class_offset, _linear_bias])
@pytest.mark.parametrize("rows", [N, 8])
def test_unset_gradient_buffers_are_written_before_they_are_read(monkeypatch, fn, rows):
    """The buffers the chunk loop leaves unset hold NaN here: every one is written whole before it is
    read (a side's gradient, summed over the chunks, starts at zeros: index 2 is a side without a bias)."""
    monkeypatch.setattr(chunked_rows, "_unset", lambda *shape, **kw: torch.full(shape, float("nan"), **kw))
    monkeypatch.setattr(chunked_rows, "_unset_like", lambda v, **kw: torch.full_like(v, float("nan"), **kw))
    monkeypatch.setattr(chunk_size, "rows_a_chunk", lambda nodes, n, budget: rows)
    h, W, y = _inputs()
    c = torch.randn(V, requires_grad=True)
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        compiled = torch.compile(fn, backend=dynamo.backend)
        got = [torch.autograd.grad(compiled(h, W, c, y), [h, W, c]) for _ in range(2)][-1]
    want = torch.autograd.grad(fn(h, W, c, y), [h, W, c])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(1,), ()])
def test_a_bias_broadcast_over_the_columns_is_left_whole(shape):
    """addmm's bias of one value (its gradient a sum over the columns too) is no row-region bias:
    the product stays whole and every gradient is eager's."""
    h, W, y = _inputs()
    bias = torch.randn(shape, requires_grad=True)

    def fn(h, W, bias, y):
        return F.cross_entropy(torch.addmm(bias, h, W.T), y)

    assert _chunked_calls(fn, h, W, bias, y) == []
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        got = torch.autograd.grad(torch.compile(fn, backend=dynamo.backend)(h, W, bias, y), [h, W, bias])
    for g, w in zip(got, torch.autograd.grad(fn(h, W, bias, y), [h, W, bias])):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_a_loss_scaled_far_down_keeps_its_gradients():
    """Tail weights of 1e-22 / N square below float32's range: the loss's gradient is read off
    them scaled to their largest, not taken for every row ignored (zero gradients)."""
    scale = 1e-22

    def fn(h, W, y):
        return scale * F.cross_entropy(h @ W.T, y)

    h, W, y = _inputs()
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        out = torch.compile(fn, backend=dynamo.backend)(h, W, y)
        got = torch.autograd.grad(out, [h, W], torch.tensor(1e20))
    for g, w in zip(got, torch.autograd.grad(fn(h, W, y), [h, W], torch.tensor(1e20))):
        assert g.abs().max() > 0
        torch.testing.assert_close(g, w, atol=1e-8, rtol=1e-4)


def test_a_failed_first_call_falls_back_to_eagers_gradients(monkeypatch, own_regions):
    """A compiled forward whose first call fails (a kernel failing at its first launch) runs the
    graph Dynamo captured instead (guarded_calls.checked_first_call). `chunked_rows_early`'s
    weights came from the tail's gradient as one value expanded (stride 0) where its fake kernel
    says a dense tensor; the compiled backward read them at stride 1 (zero gradients). The op
    now returns them dense, and the captured graph's outputs are laid out as traced."""
    calls, forward = [], chunked_rows.Region.forward_with_gradients

    def failing_once(self, *args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a kernel that failed at its first launch")
        return forward(self, *args)

    monkeypatch.setattr(chunked_rows.Region, "forward_with_gradients", failing_once)
    monkeypatch.setenv("MINICOMP_FALLBACK", "silent")  # (the tests' policy raises)
    h, W, y = _inputs()
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        got = torch.autograd.grad(torch.compile(ce_ignore, backend=dynamo.backend)(h, W, y), [h, W])
    for g, w in zip(got, torch.autograd.grad(ce_ignore(h, W, y), [h, W])):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_logits_returned_too_are_left_whole():
    def fn(h, W, y):
        logits = h @ W.T
        return F.cross_entropy(logits, y), logits

    h, W, y = _inputs()
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        loss, logits = torch.compile(fn, backend=dynamo.backend)(h, W, y)
    torch.testing.assert_close(logits, h @ W.T)


def _rewritten(fn, *inputs) -> bool:
    """Whether the ATen graph of fn has a chunked region (the finder, without compiling)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicomp import capture

    gm = make_fx(fn, decomposition_table=capture.decompositions())(*inputs)
    with config.override(chunk_budget_bytes=BUDGET):
        out = row_regions.rewrite(gm, [isinstance(x, torch.Tensor) and x.requires_grad for x in inputs])
    return out is not None


def _masked_mean(h, W, y, mask):
    losses = F.cross_entropy(h @ W.T, y, reduction="none")
    return (losses * mask).sum() / mask.sum()


def _with_logsumexp(h, W, y):
    logits = h @ W.T
    return F.cross_entropy(logits, y) + torch.logsumexp(logits, -1).mean()


def _zero_class_weights(h, W, y):
    return F.cross_entropy(h @ W.T, y, weight=torch.zeros(V))


def _ignored(inputs, rows=slice(None)):
    h, W, y = inputs
    y = y.clone()
    y[rows] = -100
    return h, W, y


@pytest.mark.parametrize("grad", [3.0, -2.0, 0.0])
@pytest.mark.parametrize("fn", [ce_ignore, ce_smoothing, ce_sum, _with_logsumexp, _masked_mean])
def test_every_row_ignored(fn, grad):
    """Eager's loss is NaN (0 / 0 rows) but its gradients 0: the ignored rows are selected away. The
    tail's weights are 1/0 (0/0 for the mask's mean): the loss's gradient G is no <g, u> / <u, u>
    (inf / inf). A loss that also reads the rows otherwise (a logsumexp's mean) keeps their
    gradient; a sum's weights are 1 (G as ever). Any sign of G, and 0."""
    inputs = _ignored(_inputs())
    inputs = (*inputs, torch.zeros(N)) if fn is _masked_mean else inputs
    _check(fn, inputs, grad=grad)


@pytest.mark.parametrize("how", ["dynamo", "jit"])
def test_all_rows_or_all_but_one_ignored(how):
    _check(ce_ignore, _ignored(_inputs()), how=how)
    _check(ce_ignore, _ignored(_inputs(), slice(1, None)), how=how)
    _check(_masked_mean, (*_inputs(), (torch.arange(N) % 4 == 0).float()), how=how)


def _nan_row(inputs, row=5):
    h, W, y = inputs
    h = h.detach().clone()
    h[row, 2] = float("nan")
    return h.requires_grad_(), W, y


@pytest.mark.parametrize(
    "fn, inputs",
    [
        (_zero_class_weights, _inputs()),  # weights 1/0 times class weights 0: NaN, the ignored rows' 0
        (_masked_mean, (*_inputs(), torch.zeros(N))),  # a mask's 0/0, rows not ignored: NaN
        (ce_ignore, _nan_row(_inputs())),  # a NaN in h: its row and all of W's gradient
        (ce_ignore, _nan_row(_ignored(_inputs()))),  # the same, every row ignored
    ],
)
def test_gradients_eager_makes_nan_stay_nan(fn, inputs):
    h, W = inputs[:2]
    ref = torch.autograd.grad(fn(*inputs), [h, W])
    assert all(g.isnan().any() for g in ref)
    _check(fn, inputs, rows=N + (fn is _zero_class_weights))  # (the class weights' gather reads an [N, V] expand)


def test_what_is_not_chunked():
    h, W, y = _inputs()
    assert _rewritten(ce_ignore, h, W, y)

    def returned(h, W, y):
        logits = h @ W.T
        return logits.logsumexp(-1), logits

    assert not _rewritten(returned, h, W, y)
    assert not _rewritten(lambda h, W, y: (h @ W.T).softmax(0).sum(-1), h, W, y)  # a reduction over rows
    assert not _rewritten(lambda h, W, y: (h @ W.T).sum(0), h, W, y)
    small = torch.randn(4, D)  # a product that fits the budget
    assert not _rewritten(lambda h, W, y: F.cross_entropy(h @ W.T, y), small, W, y[:4].clamp_min(0))


def _chunked_calls(fn, *inputs) -> list[tuple[str, int]]:
    """(op, rows a chunk) of each chunked region the finder writes into fn's ATen graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from minicomp import capture

    gm = make_fx(fn, decomposition_table=capture.decompositions())(*inputs)
    with config.override(chunk_budget_bytes=BUDGET):
        out = row_regions.rewrite(gm, [isinstance(x, torch.Tensor) and x.requires_grad for x in inputs])
    calls = [n for n in (out.graph.nodes if out is not None else []) if "chunked_rows" in str(n.target)]
    return [(n.target._opname, chunked_rows.REGIONS[n.args[-1]].rows) for n in calls]


def test_one_chunk_where_the_product_fits_and_its_gradients_come_early(monkeypatch):
    """A product that fits the budget alone, not with its gradient (on CUDA the joint writes the
    gradient over the product): one chunk where the gradients come in the forward (no product kept
    for the backward: half the [N, V] memory and none saved), left whole where they would come in
    the backward (the product made twice for nothing)."""
    monkeypatch.setattr(chunk_size, "rows_a_chunk", lambda nodes, n, budget: n)
    h, W, y = _inputs()
    assert _chunked_calls(ce_ignore, h, W, y) == [("chunked_rows_early", N)]
    assert _chunked_calls(ce_none, h, W, y) == []  # row losses returned: gradients in the backward
    monkeypatch.setattr(chunk_size, "rows_a_chunk", lambda nodes, n, budget: 8)
    assert _chunked_calls(ce_none, h, W, y) == [("chunked_rows", 8)]


def _node(shape, dtype, device):
    """A stand-in fx node: the size, dtype and device of its value, what rows_a_chunk reads."""
    val = SimpleNamespace(numel=lambda: math.prod(shape), dtype=dtype, device=torch.device(device))
    return SimpleNamespace(meta={"val": val})


@pytest.mark.parametrize(
    "device, budget, rows",
    [("cuda", 4096 * 1000 * 2, 4096), ("cuda", 4096 * 1000 * 2 - 1, 2048), ("cpu", 4096 * 1000 * 2, 1024)],
)
def test_rows_a_chunk_counts_one_value_where_the_joint_writes_over_the_product(device, budget, rows):
    """On CUDA a chunk holds one [rows, V] value of the product's dtype (its gradient written over
    it): a budget of the whole product is one chunk; elsewhere the widest value and its gradient."""
    nodes = [_node((4096, 1000), torch.bfloat16, device), _node((4096, 1000), torch.float32, device)]
    assert chunk_size.rows_a_chunk(nodes, 4096, budget) == rows


def test_not_chunked_under_the_default_budget():
    h, W, y = _inputs()
    torch._dynamo.reset()
    before = len(chunked_rows.REGIONS)
    out = torch.compile(ce_ignore, backend=dynamo.backend)(h, W, y)
    torch.testing.assert_close(out, ce_ignore(h, W, y))
    assert len(chunked_rows.REGIONS) == before
    assert minicomp is not None


def test_chunked_under_a_budget_given_as_torch_compiles_option(own_regions):
    """`options={"chunk_budget_bytes": ...}` is in force when the backend looks for regions, which
    it does before AOTAutograd's compilers (where the other options take effect) run."""
    h, W, y = _inputs()
    torch._dynamo.reset()
    compiled = torch.compile(ce_ignore, backend=dynamo.registered(), options={"chunk_budget_bytes": BUDGET})
    out = compiled(h, W, y)
    assert len(own_regions) == 1
    torch.testing.assert_close(out, ce_ignore(h, W, y))
    got, ref = torch.autograd.grad(out, [h, W]), torch.autograd.grad(ce_ignore(h, W, y), [h, W])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pad, width", [("always", 104), ("never", V)])
def test_the_chunks_run_under_torch_compiles_options(own_regions, monkeypatch, pad, width):
    """The other options given with the budget ("pad_matmuls" here) are in force where the chunks
    run, after the compile has returned: b's padding (103 float32 columns: 104 padded)."""
    widths, padded = [], chunked_rows.Region.padded

    def recording(self, b, bias):
        out = padded(self, b, bias)
        widths.append(out[0].shape[1])
        return out

    monkeypatch.setattr(chunked_rows.Region, "padded", recording)
    h, W, y = _inputs()
    torch._dynamo.reset()
    options = {"chunk_budget_bytes": BUDGET, "pad_matmuls": pad}
    out = torch.compile(ce_ignore, backend=dynamo.registered(), options=options)(h, W, y)
    got = torch.autograd.grad(out, [h, W])
    assert widths and set(widths) == {width}
    torch.testing.assert_close(got, torch.autograd.grad(ce_ignore(h, W, y), [h, W]), atol=1e-5, rtol=1e-4)


def test_rows_of_a_batch_without_a_view_back():
    """[B, S, V] logits reduced and gathered along their last dim as they are (dims 1 and 2 of a
    chunk's flattened rows)."""

    def fn(h, W, y):
        logits = h @ W.T
        picked = logits.softmax(-1).gather(2, y.clamp_min(0)[..., None]).squeeze(-1)
        return (logits.logsumexp(-1) - picked) * (y >= 0)

    h, W, y = _inputs()
    h, y = h.detach()[:36].view(3, 12, D).requires_grad_(), y[:36].view(3, 12)
    _check(fn, (h, W, y), rows=36)


@pytest.mark.gpu
def test_cuda_peak_below_the_product():
    """On CUDA (each chunk's region compiled by minicomp, its gradient over its product):
    bf16 [2048, 256] @ [32000, 256], cross-entropy of the float32 logits, against eager; the
    step's peak above its inputs is the gradients of h and W and one chunk's bf16 product within
    the 16 MiB budget (256 rows), far under the float32 logits' bytes."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    n, d, v = 2048, 256, 32000

    def fn(h, W, y):
        return F.cross_entropy((h @ W.T).float(), y, label_smoothing=0.1)

    peak = cuda_step_against_eager(fn, n, d, v, ignored_every=7)
    gradients = (n + v) * d * 2
    assert peak <= gradients + (16 << 20) + (1 << 20), f"peak {peak / 2**20:.1f} MiB"


def cuda_step_against_eager(fn, n: int, d: int, v: int, ignored_every: int | None = None) -> int:
    """fn(h, W, y) through the backend on CUDA (bf16 h [n, d], W [v, d], a 16 MiB budget) against
    eager, values and gradients; the bytes its second step's peak holds above what was allocated
    before it."""
    torch.manual_seed(0)
    h = torch.randn(n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    W = (torch.randn(v, d, device="cuda") / 16).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, v, (n,), device="cuda")
    if ignored_every:
        y[::ignored_every] = -100
    ref = fn(h, W, y)
    ref_grads = torch.autograd.grad(ref, [h, W])
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=16 << 20):
        compiled = torch.compile(fn, backend=dynamo.backend)
        torch.autograd.grad(compiled(h, W, y), [h, W])  # compiles
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = compiled(h, W, y)
        grads = torch.autograd.grad(out, [h, W])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    return peak


def test_no_grad_forward_is_chunked(monkeypatch):
    h, W, y = _inputs()
    calls = []
    forward = chunked_rows.Region.forward
    monkeypatch.setattr(chunked_rows.Region, "forward", lambda self, inputs: calls.append(1) or forward(self, inputs))
    torch._dynamo.reset()
    with torch.no_grad(), config.override(chunk_budget_bytes=BUDGET):
        out = torch.compile(ce_smoothing, backend=dynamo.backend)(h, W, y)
    torch.testing.assert_close(out, ce_smoothing(h, W, y))
    assert calls


def test_frozen_weight():
    """W needs no gradient: the backward computes h's alone."""
    h, W, y = _inputs()
    W = W.detach()

    def fn(h, W, y):
        return F.cross_entropy(h @ W.T, y)

    ref = torch.autograd.grad(fn(h, W, y), h)[0]
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        got = torch.autograd.grad(torch.compile(fn, backend=dynamo.backend)(h, W, y), h)[0]
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


def _jit_training_function(fn, *tensors):
    from functorch.compile import aot_function, nop

    with config.override(chunk_budget_bytes=BUDGET):
        aot = lambda g, a, b: aot_function(g, nop, nop)  # noqa: E731
        return chunk_tracing.training_function(aot, (fn, None, None), list(tensors))


def test_a_no_grad_block_is_not_chunked_away():
    """Regression: jit's training path traced the function to ATen without its `no_grad` block, so
    the gradient flowed through a value eager computes without one (W's gradient 3% off)."""
    h, W, y = _inputs()
    W = W.detach().t().contiguous().requires_grad_()  # [D, V]

    def fn(h, W, y):
        with torch.no_grad():
            scale = W.norm()
        return F.cross_entropy((h @ W) / scale, y)

    function, chunked = _jit_training_function(fn, h, W, y)
    assert not chunked
    assert _jit_training_function(lambda h, W, y: F.cross_entropy((h @ W) / W.norm(), y), h, W, y)[1]
    expected = torch.autograd.grad(fn(h, W, y), W)[0]
    torch.testing.assert_close(torch.autograd.grad(function(h, W, y), W)[0], expected)


def test_a_gather_whose_index_is_not_by_rows_stays_whole():
    """Regression: a gather's index does not broadcast; one of shape [1, k] over the product made
    a region whose chunks could not gather (a RuntimeError where eager works)."""
    h, W, _ = _inputs()
    W = W.detach().t().contiguous().requires_grad_()
    index = torch.tensor([[5]])
    fn = lambda h, W, i: (h @ W).gather(1, i).sum()  # noqa: E731
    function, chunked = _jit_training_function(fn, h, W, index)
    assert not chunked
    torch.testing.assert_close(function(h, W, index), fn(h, W, index))


def _detached_max(h, W, y):
    losses = F.cross_entropy(h @ W.T, y, reduction="none")
    return losses.sum() / losses.detach().max()


def test_a_detach_is_not_traced_away():
    """Regression: the functionalized ATen trace the rewrite reads turned `detach` into `alias`, so
    the chunked backward sent a gradient through the detached max (h's gradient off by 2.6). A
    graph that detaches is left whole, through the backend and through jit's training path."""
    h, W, y = _inputs()
    ref = _detached_max(h, W, y)
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        out = torch.compile(_detached_max, backend=dynamo.backend)(h, W, y)
        grads = torch.autograd.grad(out, [h, W])
    for got, want in zip(grads, torch.autograd.grad(ref, [h, W])):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    function, chunked = _jit_training_function(_detached_max, h, W, y)
    assert not chunked
    expected = torch.autograd.grad(_detached_max(h, W, y), h)[0]
    torch.testing.assert_close(torch.autograd.grad(function(h, W, y), h)[0], expected)


def test_a_block_that_turns_autocast_off_is_chunked():
    """A block that turns autocast off where it was off (transformers' Llama computes its rotary
    embedding so) changes nothing: the graph is still chunked, and right."""

    def fn(h, W, y):
        with torch.autocast("cpu", enabled=False):
            h = h * 2
        return F.cross_entropy(h @ W.T, y)

    assert _rewritten(fn, *_inputs())
    _check(fn, _inputs())


def test_a_no_grad_block_of_constants_is_chunked():
    """A no_grad block that reads nothing needing a gradient (transformers' Llama computes its rotary
    cos and sin so) loses nothing in the ATen trace: the graph is chunked, and right. One that reads
    h is not (test_a_no_grad_block_is_not_chunked_away)."""
    positions = torch.arange(N, dtype=torch.float32)

    def fn(h, W, y):
        with torch.no_grad():
            scale = 1 + positions.cos()[:, None] / 4
        return F.cross_entropy((h * scale) @ W.T, y)

    _check(fn, _inputs())

    def reads_h(h, W, y):
        with torch.no_grad():
            scale = h.abs().mean()
        return F.cross_entropy((h / scale) @ W.T, y)

    h, W, y = _inputs()
    torch._dynamo.reset()
    with config.override(chunk_budget_bytes=BUDGET):
        out = torch.compile(reads_h, backend=dynamo.backend)(h, W, y)
        got = torch.autograd.grad(out, h)[0]
    torch.testing.assert_close(got, torch.autograd.grad(reads_h(h, W, y), h)[0], atol=1e-5, rtol=1e-4)


def test_weights_one_gradient_gives_two_results_are_outputs_of_their_own(own_regions):
    """Two row results summed into the loss get one gradient from the tail, expanded for each; the
    custom op's outputs may not alias, so a weight sharing memory is copied (every call raised)."""

    def fn(h, W, y):
        logits = h @ W.T
        return F.cross_entropy(logits, y, reduction="sum") + torch.logsumexp(logits, -1).pow(2).sum()

    h, W, y = _inputs()
    y = y.clamp_min(0)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=dynamo.registered(), options={"chunk_budget_bytes": BUDGET})
    for _ in range(2):
        out, ref = compiled(h, W, y), fn(h, W, y)
        torch.testing.assert_close(out, ref)
        got, want = torch.autograd.grad(out, [h, W]), torch.autograd.grad(ref, [h, W])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert len(own_regions) == 1


@pytest.mark.parametrize("value", [1e4, -1, True])
def test_an_option_of_the_wrong_kind_is_refused_when_compiled(value):
    """A float byte budget made chunks of 10.0 rows (every call raised); a negative one turned
    chunking on; both are a clear error now."""
    torch._dynamo.reset()
    compiled = torch.compile(ce_ignore, backend=dynamo.registered(), options={"chunk_budget_bytes": value})
    with pytest.raises(Exception, match="option 'chunk_budget_bytes' takes"):
        compiled(*_inputs())
