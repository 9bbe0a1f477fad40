"""Matmul templates (issue #40): mm, addmm and bmm as one Triton kernel each, with the pointwise
consumers of the product (bias, activation, residual, cast) evaluated in the template's store
(plan/matmul.py, codegen/matmul.py, templates/matmul.py.j2). Against eager with
MINICOMP_MATMUL=template (`config.override(matmul=...)`) on odd sizes, transposed and batched
operands, every dtype, forward and gradients (the backward's mms are templates too), through
`minicomp.jit` and `torch.compile(backend="minicomp")`; kernel counts say what fused. The default
("library") and "auto" keep ATen's matmuls on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import aten_call, check, grads_match, kernel_count

import minicomp
import minicomp.dispatch.dynamo  # noqa: F401  (registers the backend)
from minicomp import config

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def template():
    """Every test forces the template, on fixed random inputs: a 16-bit product rounded next to 0
    may fall on the other side of a ReLU from the float32 reference (conftest.grads_match)."""
    torch.manual_seed(0)
    with config.override(matmul="template"):
        yield


def _kinds(compiled) -> list[str]:
    return [k.kind for k in compiled.kernels]


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu_epilogue_is_one_kernel(device, dtype):
    x, w, b = (torch.randn(s, dtype=dtype, device=device) for s in ((33, 17), (17, 45), (45,)))
    source = check(lambda x, w, b: F.gelu(x @ w + b), x, w, b, kernels=1)
    assert "tl.dot(" in source and not aten_call(source, "mm")
    assert "tl.store(out_ptr" in source and source.count("tl.store(") == 1  # the product is not written


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_operands(device, dtype):
    a = torch.randn(17, 33, dtype=dtype, device=device)
    b = torch.randn(45, 17, dtype=dtype, device=device)
    source = check(lambda a, b: (a.t() @ b.t()).relu(), a, b, kernels=1)
    assert "* 33 +" in source or "* 33" in source  # a read at its strides: no copy kernel


def test_linear_addmm_with_bias_broadcast_and_scales(device):
    x, w, b = torch.randn(9, 20, device=device), torch.randn(30, 20, device=device), torch.randn(30, device=device)
    check(lambda x, w, b: F.linear(x, w, b).sigmoid(), x, w, b, kernels=1)
    col = torch.randn(9, 1, device=device)
    check(lambda x, w, c: torch.addmm(c, x, w.t(), beta=0.5, alpha=2.0), x, w, col, kernels=1)


def test_linear_on_three_dims_fuses_through_the_view(device):
    """nn.Linear on [B, S, K]: addmm on the [B*S, K] view, then a view back to [B, S, N]; the
    activation after the view is still the template's epilogue."""
    x, w, b = torch.randn(2, 5, 12, device=device), torch.randn(24, 12, device=device), torch.randn(24, device=device)
    check(lambda x, w, b: F.silu(F.linear(x, w, b)), x, w, b, kernels=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bmm_with_batch_in_the_grid(device, dtype):
    q = torch.randn(3, 19, 24, dtype=dtype, device=device)
    k = torch.randn(3, 33, 24, dtype=dtype, device=device)
    source = check(lambda q, k: torch.bmm(q, k.transpose(1, 2)) * 0.125, q, k, kernels=1)
    assert "pid_b = pid //" in source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_product_of_one_row_or_one_column(device, dtype):
    """A decoding step's [1, d] @ [d, n] (and [m, d] @ [d, 1], a batch of [1, n]): the store's
    address has no term for the size-1 dim, so its pointer is broadcast to the tile (the store
    failed to compile before)."""
    w, b = torch.randn(48, 80, dtype=dtype, device=device), torch.randn(48, dtype=dtype, device=device)
    x = torch.randn(1, 80, dtype=dtype, device=device)
    check(lambda x, w, b: F.linear(x, w, b).relu(), x, w, b, kernels=1)
    check(lambda x, w, r: F.linear(x, w) + r, x, w, torch.randn(1, 48, dtype=dtype, device=device), kernels=1)
    column = torch.randn(1, 80, dtype=dtype, device=device)
    rows = torch.randn(9, 80, dtype=dtype, device=device)
    check(lambda x, c: F.linear(x, c).sigmoid(), rows, column, kernels=1)
    one = torch.randn(3, 1, 80, dtype=dtype, device=device)
    check(lambda a, b: torch.bmm(a, b).relu(), one, torch.randn(3, 80, 24, dtype=dtype, device=device), kernels=1)
    check(lambda a, b: (a @ b).relu(), x, torch.randn(80, 1, dtype=dtype, device=device), kernels=1)  # one element


ROW_FORM = "one row of a times b"  # the one-row form's comment (templates/matmul.py.j2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_times_a_weight_read_along_k_is_the_one_row_form(device, dtype):
    """A decoding step's x @ W.T (W an nn.Linear weight, [N, K]) runs without tl.dot, its
    epilogue fused (codegen/matmul.py's one-row form): nn.Linear on [1, 1, K], K past one step of
    the interpreter's 64, N odd; a batch of one-row products (bmm); a weight cast as it is loaded."""
    x = torch.randn(1, 1, 130, dtype=dtype, device=device)
    w, b = torch.randn(70, 130, dtype=dtype, device=device) / 8, torch.randn(70, dtype=dtype, device=device)
    source = check(lambda x, w, b: F.gelu(F.linear(x, w, b)) * 2, x, w, b, kernels=1)
    assert ROW_FORM in source and "tl.dot(" not in source and source.count("tl.store(") == 1
    q, k = (torch.randn(s, dtype=dtype, device=device) for s in ((3, 1, 40), (3, 50, 40)))
    assert ROW_FORM in check(lambda q, k: torch.bmm(q, k.transpose(1, 2)).relu(), q, k, kernels=1)
    w32 = torch.randn(70, 130, device=device) / 8
    source = check(lambda x, w: F.linear(x, w.to(x.dtype)).sigmoid(), x, w32, kernels=1)
    assert ROW_FORM in source and "tl.dot(" not in source
    rows = torch.randn(2, 130, dtype=dtype, device=device)  # two rows, or a weight read along N: tl.dot
    assert ROW_FORM not in check(lambda x, w: F.linear(x, w).relu(), rows, w, kernels=1)
    assert ROW_FORM not in check(lambda x, w: (x @ w).relu(), x, w.t().contiguous(), kernels=1)


COMBINED = "in one launch (independent one-row products"  # templates/row_products.py.j2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_products_of_one_row_share_a_launch(device, dtype):
    """A decoding step's q, k and v of one row (codegen/row_products.py): three one-row templates,
    one launch, each piece with its own epilogue (v's bias and ReLU); a product of another's
    result, or one its launch would tune (config "tune_min_numel"), launches alone."""
    x = torch.randn(1, 1, 96, dtype=dtype, device=device)
    wq, wk, wv = (torch.randn(n, 96, dtype=dtype, device=device) / 8 for n in (96, 32, 40))
    bv = torch.randn(40, dtype=dtype, device=device)

    def qkv(x, wq, wk, wv, bv):
        return F.linear(x, wq), F.linear(x, wk), F.linear(x, wv, bv).relu()

    source = check(qkv, x, wq, wk, wv, bv, kernels=1)
    assert COMBINED in source and source.count("RowProductsLaunch(") == 1 and ROW_FORM in source
    w1, w2 = torch.randn(200, 96, dtype=dtype, device=device) / 8, torch.randn(32, 200, dtype=dtype, device=device) / 8
    assert COMBINED not in check(lambda x, w1, w2: F.linear(F.linear(x, w1), w2), x, w1, w2, kernels=2)
    with config.override(tune_min_numel=96 * 96):
        assert COMBINED in check(qkv, x, wq, wk, wv, bv, kernels=2)  # q alone, k and v together


def test_explain_names_a_shared_launch_of_one_row_products():
    """`explain`'s matmul section on a GPU, after the first call, reads each template launch's
    tuning; a shared launch of one-row templates has none (RowProductsLaunch): it names their tiles
    (it raised AttributeError). The GPU is stood in for by the launch's device and configuration."""
    from minicomp.runtime.launch_spec import RowProductsLaunch
    from minicomp.tools.explain import _matmuls

    x, wq, wk = torch.randn(1, 64), torch.randn(64, 64), torch.randn(32, 64)
    compiled = minicomp.jit(lambda x, wq, wk: (F.linear(x, wq), F.linear(x, wk))).compiled(x, wq, wk)
    [call] = compiled.kernels
    launch = compiled.launch(call)
    assert isinstance(launch.spec, RowProductsLaunch)
    launch.device, launch.config = torch.device("cuda"), (1, 4)
    [(_, text)] = _matmuls(compiled, "")
    assert "one launch of one-row templates at tiles" in text and "4 warps" in text


def test_an_operand_broadcast_along_the_tile_is_computed_at_the_whole_tile(device):
    """A computed operand that does not vary along one of its tile's axes (a column expanded over
    N, a row [1, K]) is broadcast to the tile before tl.dot (which refused its shape), whatever M."""
    v = torch.randn(96, device=device)
    for rows in (1, 2, 16):
        x = torch.randn(rows, 96, device=device)
        check(lambda x, v: x @ (v.unsqueeze(1).expand(96, 40) * 2), x, v, kernels=1)


def test_a_chain_of_one_row(device):
    """An MLP chain on one row (a decoding step's small MLP): the inner product's operand a row
    [1, K], whose index has no term for the tile's rows, broadcast to the tile (tl.dot refused
    its [1, BLOCK_K] shape before)."""
    x = torch.randn(1, 1, 96, device=device)
    w1, w2 = torch.randn(96, 96, device=device) / 8, torch.randn(32, 96, device=device) / 8
    source = check(lambda x, w1, w2: F.linear(F.relu(F.linear(x, w1)), w2), x, w1, w2, kernels=1)
    assert "(chained)" in source


def test_a_backward_matmul_alike_to_a_forward_one_keeps_its_operands(device):
    """Forward and backward share kernel families: a backward template (`tangents @ w`) named and
    written like a forward one (`relu @ w`: the same epilogue text) is its own family, as its
    template names its operands outside the body (it read the forward's parameter names, an
    unassigned `tangents_1_ptr`, before)."""

    def layers(x, wq1, wk1, wv1, wq2, wk2, wv2):
        h = (F.linear(x, wq1) + F.linear(x, wk1) + F.linear(x, wv1)).relu()
        return F.linear(h, wq2) * F.linear(h, wk2) + F.linear(h, wv2)

    weights = [torch.randn(96, 96, device=device) / 8 for _ in range(6)]
    entry = grads_match(layers, torch.randn(1, 96, device=device), *weights)
    assert "RowProductsLaunch(" in entry.forward.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_of_a_one_row_product(device, dtype):
    """Training on one row: the forward's product is the one-row form, the backward's (dx = dy @ W
    reads W along N, dW = dy^T @ x has N rows) are tl.dot templates."""
    x = torch.randn(1, 90, dtype=dtype, device=device)
    w, b = torch.randn(33, 90, dtype=dtype, device=device) / 8, torch.randn(33, dtype=dtype, device=device)
    entry = grads_match(lambda x, w, b: torch.tanh(F.linear(x, w, b)), x, w, b)
    assert ROW_FORM in entry.forward.source and ROW_FORM not in entry.backward.source


@pytest.mark.gpu
def test_one_row_products_run_as_the_template_by_default_on_cuda():
    """On CUDA the default setting ("library") still runs a one-row product read along K as the
    template (config "matmul_rows", K >= "matmul_row_min_k"), a decoding step's projections; with
    matmul_rows off, or a shorter K, cuBLAS."""
    from minicomp.plan.matmul import choices

    x = torch.randn(1, 1, 1024, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(3000, 1024, device="cuda", dtype=torch.bfloat16) / 32, torch.randn(3000, device="cuda")
    fn = minicomp.jit(lambda x, w, b: F.gelu(F.linear(x, w, b.to(x.dtype))))
    with config.override(matmul="library"):
        torch.testing.assert_close(fn(x, w, b), F.gelu(F.linear(x, w, b.to(x.dtype))), atol=2e-2, rtol=2e-2)
        source = fn.source(x, w, b)
        assert ROW_FORM in source and not aten_call(source, "mm") and not aten_call(source, "addmm")
        assert "one row read along K" in choices(fn.compiled(x, w, b).plan)[0]
        with config.override(matmul_rows=False):
            assert ROW_FORM not in minicomp.jit(lambda x, w: F.linear(x, w)).source(x, w)
        short = x[..., :256]
        assert ROW_FORM not in minicomp.jit(lambda x, w: F.linear(x, w)).source(short, w[:, :256])


def test_residual_add_and_cast_to_bf16(device):
    x, w, r = torch.randn(16, 24, device=device), torch.randn(24, 40, device=device), torch.randn(16, 40, device=device)
    check(lambda x, w, r: (x @ w + r).to(torch.bfloat16), x, w, r, kernels=1)


def test_product_also_returned_is_written_once_with_its_epilogue(device):
    x, w = torch.randn(20, 12, device=device), torch.randn(12, 18, device=device)
    source = check(lambda x, w: (lambda y: (y, y.relu()))(x @ w), x, w, kernels=1)
    assert source.count("tl.store(") == 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_matmuls_of_one_stage_swiglu(device, dtype):
    """silu(x @ w1) * (x @ w3) with config matmul_siblings: one kernel, the first product a
    sibling of the second (its own accumulator and K loop at the epilogue's tile), never written.
    Off, two kernels: the second's epilogue reads the first's product."""
    x = torch.randn(10, 16, device=device, dtype=dtype)
    w1, w3 = (torch.randn(16, 24, device=device, dtype=dtype) / 4 for _ in range(2))
    fn = lambda x, w1, w3: F.silu(x @ w1) * (x @ w3)  # noqa: E731
    with config.override(matmul_siblings=True):
        source = check(fn, x, w1, w3, kernels=1)
    assert not aten_call(source, "mm") and "(sibling)" in source and source.count("tl.store(") == 1
    source = check(fn, x, w1, w3, kernels=2)  # the default: off (measured slower, docs/experiments.md)
    assert "(sibling)" not in source


def test_a_sibling_product_read_elsewhere_is_written(device):
    """A product also returned is written by its own kernel and read by the other's epilogue."""
    x = torch.randn(10, 16, device=device)
    w1, w3 = torch.randn(16, 24, device=device), torch.randn(16, 24, device=device)
    with config.override(matmul_siblings=True):
        source = check(lambda x, w1, w3: (lambda p: (F.silu(p) * (x @ w3), p))(x @ w1), x, w1, w3, kernels=2)
    assert "(sibling)" not in source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_is_one_kernel(device, dtype):
    """x @ w + s * (x @ a) @ b with config matmul_siblings: one kernel. `x @ w` is a sibling of
    `(x @ a) @ b`, and `x @ a` (rank 16) is chained into it: computed again for each column tile
    of the output, a sixteenth of the sibling's multiply-adds a tile (plan/matmul.py
    `matmul_folding._recomputed`). Off (the default), `x @ w` is a kernel of its own."""
    x = torch.randn(70, 40, device=device, dtype=dtype)
    w, a = torch.randn(40, 300, device=device, dtype=dtype) / 6, torch.randn(40, 16, device=device, dtype=dtype) / 6
    b = torch.randn(16, 300, device=device, dtype=dtype) / 4
    fn = lambda x, w, a, b: x @ w + 2.0 * ((x @ a) @ b)  # noqa: E731
    with config.override(matmul_siblings=True):
        source = check(fn, x, w, a, b, kernels=1)
    assert "(chained)" in source and "(sibling)" in source and source.count("tl.store(") == 1
    assert "(sibling)" not in check(fn, x, w, a, b, kernels=2)


def test_a_chain_recomputed_too_often_is_not_taken(device):
    """`relu(x @ a) @ b` with 300 output columns: each of 3 column tiles of 128 would compute
    `x @ a` (K = 200) again, twice its work more: over a quarter of the kernel's, two kernels.
    With K = 20 it is under: one kernel, correct on every column tile."""
    fn = lambda x, a, b: torch.relu(x @ a) @ b  # noqa: E731
    for k, kernels in ((200, 2), (20, 1)):
        x, a = torch.randn(70, k, device=device), torch.randn(k, 64, device=device) / k**0.5
        source = check(fn, x, a, torch.randn(64, 300, device=device) / 8, kernels=kernels)
        assert ("(chained)" in source) == (kernels == 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_through_the_template(device, dtype):
    x = torch.randn(13, 20, dtype=dtype, device=device)
    w, b = torch.randn(20, 27, dtype=dtype, device=device), torch.randn(27, dtype=dtype, device=device)
    entry = grads_match(lambda x, w, b: torch.relu(x @ w + b), x, w, b)
    assert _kinds(entry.forward)[0] == "matmul" and not aten_call(entry.forward.source, "mm")
    # dx = dy' @ w.t() and dw = x.t() @ dy', dy' the ReLU's gradient: templates reading transposed operands
    assert _kinds(entry.backward).count("matmul") == 2, entry.backward.source
    assert not aten_call(entry.backward.source, "mm")


def test_torch_compile_backend(device):
    x, w, b = torch.randn(33, 17, device=device), torch.randn(17, 45, device=device), torch.randn(45, device=device)

    def mlp(x, w, b):
        return torch.tanh(x @ w + b) * 2

    torch._dynamo.reset()
    compiled = torch.compile(mlp, backend="minicomp")
    torch.testing.assert_close(compiled(x, w, b), mlp(x, w, b))
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    compiled(xg, wg, b).sum().backward()
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    mlp(xe, we, b).sum().backward()
    torch.testing.assert_close(xg.grad, xe.grad)
    torch.testing.assert_close(wg.grad, we.grad)


def test_library_and_auto_on_cpu_keep_aten(device):
    x, w, b = torch.randn(8, 16, device=device), torch.randn(16, 8, device=device), torch.randn(8, device=device)
    fn = lambda x, w, b: torch.relu(x @ w + b)  # noqa: E731
    with config.override(matmul="library"):
        source = check(fn, x, w, b, kernels=1)
    assert aten_call(source, "mm") and "tl.dot(" not in source
    if device.type == "cpu":
        with config.override(matmul="auto"):
            assert aten_call(check(fn, x, w, b, kernels=1), "mm")
    with config.override(matmul="sometimes"), pytest.raises(Exception, match="must be one of auto, template"):
        minicomp.jit(lambda x, w: torch.relu(x @ w) * 3, fallback="raise")(x, w)


def test_plan_names_the_choice():
    x, w, b = torch.randn(8, 16), torch.randn(16, 8), torch.randn(8)
    compiled = minicomp.jit(lambda x, w, b: torch.relu(x @ w + b))
    text = str(compiled.compiled(x, w, b).plan)
    assert "matmul template over [8, 8] (template: MINICOMP_MATMUL=template)" in text
    assert kernel_count(compiled.source(x, w, b)) == 1


def test_inputs_named_like_the_templates_variables(device):
    """An epilogue input named `mask` or `acc` does not overwrite the template's own variables."""

    def fn(a, b, mask, acc):
        return (a @ b) * mask + acc

    a, b = torch.randn(12, 20, device=device), torch.randn(20, 9, device=device)
    check(fn, a, b, torch.randn(12, 9, device=device), torch.randn(9, device=device), kernels=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_and_bmm_gradients(device, dtype):
    """A [B, S, K] linear with GELU, then attention-like scores (bmm) with a scale: every matmul of
    the forward and the backward a template."""

    def fn(x, w, b):
        h = F.gelu(F.linear(x, w, b))
        return torch.bmm(h, h.transpose(1, 2)) * 0.5

    x = torch.randn(2, 7, 12, dtype=dtype, device=device) * 0.5  # bf16 gradients within grads_match's 5e-2
    w, b = torch.randn(20, 12, dtype=dtype, device=device) * 0.3, torch.randn(20, dtype=dtype, device=device)
    entry = grads_match(fn, x, w, b)
    for compiled in (entry.forward, entry.backward):
        assert not aten_call(compiled.source, "mm") and not aten_call(compiled.source, "bmm")
        assert "matmul" in _kinds(compiled)


@pytest.mark.gpu
def test_auto_on_cuda_times_the_choice():
    """On CUDA, "auto" times the template against cuBLAS + an epilogue kernel for a matmul with an
    epilogue (runtime/matmul_choice.py) and says so in the plan; a bare matmul stays cuBLAS."""
    from minicomp.plan.matmul import choices

    x, w, b = (torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in ((2048, 512), (256, 512), (256,)))
    with config.override(matmul="auto"):
        fn = minicomp.jit(lambda x, w, b: torch.relu(F.linear(x, w, b)))
        torch.testing.assert_close(fn(x, w, b), torch.relu(F.linear(x, w, b)), atol=2e-2, rtol=2e-2)
        lines = choices(fn.compiled(x, w, b).plan)
        assert len(lines) == 1 and "auto, timed" in lines[0], lines
        bare = minicomp.jit(lambda x, w: x @ w.t())
        assert "no epilogue" in choices(bare.compiled(x, w).plan)[0]


def test_one_tensor_as_both_operands_and_an_epilogue_input(device):
    x = torch.randn(24, 24, device=device)
    check(lambda x: torch.tanh(x @ x) + x, x, kernels=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prologue_scale_and_cast_of_the_operands(device, dtype):
    """Operands only the matmul reads, computed from other tensors by a pointwise kernel (LoRA's
    input scaling, a weight cast, through linear's transposing view), are computed in the
    template's K loop as it loads them: mm, its prologues and its epilogue are one kernel."""
    x, s = torch.randn(33, 17, device=device, dtype=dtype), torch.randn(17, device=device, dtype=dtype)
    w, b = torch.randn(45, 17, device=device), torch.randn(45, device=device, dtype=dtype)
    fn = lambda x, s, w, b: torch.relu(F.linear(x * s, w.to(x.dtype), b))  # noqa: E731
    source = check(fn, x, s, w, b, kernels=1)
    assert "a computed as it is loaded" in source
    if dtype != torch.float32:  # (a float32 `w.to(float32)` is `w`: read at its strides, no prologue)
        assert "b computed as it is loaded" in source
        assert not aten_call(source, "permute")  # the transposing view is read in the kernel


def test_prologue_operand_read_elsewhere_is_written(device):
    """An operand the caller also gets back is written by its kernel and read by the template."""
    x, w = torch.randn(20, 12, device=device), torch.randn(12, 18, device=device)
    source = check(lambda x, w: (lambda h: (h @ w, h))(x.exp()), x, w, kernels=2)
    assert "computed as it is loaded" not in source


def _mlp(x, *layers, act=torch.relu):
    """Linear layers with `act` between them (none after the last)."""
    for i, (w, b) in enumerate(layers):
        x = F.linear(x, w, b)
        x = act(x) if i < len(layers) - 1 else x
    return x


def _layers(widths, dtype, device, bias=True):
    return [
        (
            torch.randn(n, k, dtype=dtype, device=device) / k**0.5,
            torch.randn(n, dtype=dtype, device=device) if bias else None,
        )
        for k, n in zip(widths, widths[1:])
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("widths", [(40, 48, 24), (40, 48, 33, 24)])
def test_an_mlp_chain_is_one_kernel(device, dtype, widths):
    """An MLP whose hidden widths fit on chip is one kernel: each layer's product is computed
    where the next one reads its operand a (nested K loops), the hidden values never written;
    odd sizes, 2 and 3 layers, every dtype."""
    x = torch.randn(70, widths[0], dtype=dtype, device=device)
    layers = _layers(widths, dtype, device)
    source = check(lambda x, *p: _mlp(x, *zip(p[::2], p[1::2])), x, *[t for pair in layers for t in pair], kernels=1)
    assert source.count("tl.store(") == 1 and source.count("(chained)") == len(widths) - 2
    assert source.count("tl.dot(") == len(widths) - 1


def test_a_chain_through_three_dim_linears_and_gelu(device):
    """nn.Linear on [B, S, K] (its views of the hidden value), GELU between, no biases."""
    x = torch.randn(3, 11, 20, device=device)
    layers = _layers((20, 36, 16), torch.float32, device, bias=False)
    fn = lambda x, w1, w2: _mlp(x, (w1, None), (w2, None), act=F.gelu)  # noqa: E731
    source = check(fn, x, layers[0][0], layers[1][0], kernels=1)
    assert "(chained)" in source


def test_a_hidden_value_read_elsewhere_keeps_its_kernel(device):
    """A hidden value the caller also gets back (or a backward saves) is written: two kernels."""
    x = torch.randn(30, 20, device=device)
    (w1, b1), (w2, b2) = _layers((20, 32, 16), torch.float32, device)

    def fn(x, w1, b1, w2, b2):
        h = torch.relu(F.linear(x, w1, b1))
        return F.linear(h, w2, b2), h

    source = check(fn, x, w1, b1, w2, b2, kernels=2)
    assert "(chained)" not in source


def test_a_chain_wider_than_the_setting_or_transposed_is_not_chained(device):
    x = torch.randn(30, 20, device=device)
    (w1, b1), (w2, b2) = _layers((20, 32, 16), torch.float32, device)
    fn = lambda x, w1, b1, w2, b2: _mlp(x, (w1, b1), (w2, b2))  # noqa: E731
    with config.override(matmul_chain_width=24):
        check(fn, x, w1, b1, w2, b2, kernels=2)
    transposed = lambda x, w1, w2: torch.relu(x @ w1).t() @ w2  # [32, 30] @ [30, 16]  # noqa: E731
    source = check(transposed, x, w1.t().contiguous(), torch.randn(30, 16, device=device), kernels=2)
    assert "(chained)" not in source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chain_with_a_cast_prologue_and_gradients(device, dtype):
    """The first layer's input cast is computed in the innermost loop; a training call (the
    forward saves its hidden values for the backward) is not chained and still matches."""
    x = torch.randn(50, 24, device=device)
    layers = _layers((24, 40, 16), dtype, device)
    fn = lambda x, w1, b1, w2, b2: _mlp(x.to(w1.dtype), (w1, b1), (w2, b2))  # noqa: E731
    params = [t for pair in layers for t in pair]
    check(fn, x, *params, kernels=1)
    grads_match(fn, x.to(dtype), *params)


def test_a_chain_whose_hidden_layer_has_a_sibling(device):
    """A SwiGLU MLP of small widths with config matmul_siblings: `silu(x @ w1) * (x @ w3)` is the
    chained operand of `@ w2`, and `x @ w1` a sibling inside the chain: one kernel."""
    x = torch.randn(40, 24, device=device)
    w1, w3, w2 = (
        torch.randn(24, 32, device=device) / 5,
        torch.randn(24, 32, device=device) / 5,
        torch.randn(32, 20, device=device) / 6,
    )
    fn = lambda x, w1, w3, w2: (F.silu(x @ w1) * (x @ w3)) @ w2  # noqa: E731
    with config.override(matmul_siblings=True):
        source = check(fn, x, w1, w3, w2, kernels=1)
    assert "(chained)" in source and "(sibling)" in source


@pytest.mark.gpu
def test_auto_chains_an_mlps_last_layer_on_cuda(monkeypatch):
    """MINICOMP_MATMUL=auto on CUDA, the timing stubbed to take the template: the last layer (no
    epilogue) joins the chain (plan/matmul_folding.py `chain_ends`), one kernel, as eager computes."""
    from minicomp.runtime import matmul_choice

    monkeypatch.setattr(matmul_choice, "template_pays", lambda *a: (True, "template: timed"))
    x = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
    layers = _layers((64, 64, 32), torch.bfloat16, torch.device("cuda"))
    with config.override(matmul="auto", matmul_min_macs=0):
        source = check(
            lambda x, *p: _mlp(x, *zip(p[::2], p[1::2])), x, *[t for pair in layers for t in pair], kernels=1
        )
    assert "(chained)" in source and "auto: chained to" in source


def test_explain_lists_each_folded_matmul():
    """`explain`'s matmul section names the chained layers and where they went."""
    x = torch.randn(30, 20)
    (w1, b1), (w2, b2) = _layers((20, 32, 16), torch.float32, torch.device("cpu"))
    text = str(minicomp.explain(minicomp.jit(lambda x, w1, b1, w2, b2: _mlp(x, (w1, b1), (w2, b2))), x, w1, b1, w2, b2))
    section = text.split("==== matmuls ====")[1].split("====")[0]
    assert "Triton template mc_" in section and "chained into mc_" in section and "never written" in section
