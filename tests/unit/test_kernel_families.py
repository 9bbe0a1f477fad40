"""Kernel families (codegen/families.py): a new sequence length reuses one kernel text with runtime sizes."""

import re

import pytest
import torch
import workloads as w
from conftest import kernel_text

import minicomp
from minicomp.codegen import families
from minicomp.runtime import records


def rope_inputs(seq, head_dim=16, layout="BHSD", requires_grad=False, device="cpu"):
    shape = (2, 3, seq, head_dim) if layout == "BHSD" else (2, seq, 3, head_dim)
    table = (seq, head_dim) if layout == "BHSD" else (seq, 1, head_dim)
    q, k = (torch.randn(shape, device=device, requires_grad=requires_grad) for _ in range(2))
    return [q, k, torch.randn(table, device=device), torch.randn(table, device=device)]


def check_rope(fn, inputs):
    out = fn(*inputs)
    expected = w.rope(*inputs)
    torch.testing.assert_close(out, expected)
    if inputs[0].requires_grad:
        grads = [torch.randn_like(o) for o in expected]
        got = torch.autograd.grad(out, inputs[:2], grads)
        torch.testing.assert_close(got, torch.autograd.grad(expected, inputs[:2], grads))


@pytest.mark.parametrize("layout", ["BHSD", "BSHD"])
def test_sequence_lengths_after_the_second_share_one_kernel_text(layout, device):
    fn = minicomp.jit(w.rope)
    texts = []
    for seq in (8, 16, 24, 40):
        inputs = rope_inputs(seq, layout=layout, device=device)
        check_rope(fn, inputs)
        texts.append(kernel_text(fn.source(*inputs)))
    assert "s0" not in texts[0][0]  # the first length keeps its constants
    assert ", s0, BLOCK_SIZE" in texts[1][0]  # the second makes the sequence length an argument
    assert texts[1] == texts[2] == texts[3]  # and every later one reuses that text
    size = 40 * 16 if layout == "BHSD" else 40  # cos's index: offsets % (S*D), or x1 % S
    assert f"runtime sizes: s0 = {size} " in fn.source(*rope_inputs(40, layout=layout, device=device))


def test_the_backward_kernel_joins_a_family_too(device):
    fn = minicomp.jit(w.rope)
    texts = []
    for seq in (8, 16, 24):
        inputs = rope_inputs(seq, requires_grad=True, device=device)
        check_rope(fn, inputs)
        texts.append(kernel_text(fn.source(*inputs)))
    assert len(texts[1]) == 2 and texts[1] == texts[2]


def test_a_member_that_differs_somewhere_new_widens_the_family():
    """A new head dim changes literals the sequence length never touched: they become sizes too."""
    fn = minicomp.jit(w.rope)
    for seq, head_dim in [(8, 16), (16, 16), (16, 32), (24, 64), (8, 16)]:
        check_rope(fn, rope_inputs(seq, head_dim))
    source = fn.source(*rope_inputs(24, 64))
    assert re.search(r"x3 = offsets % s\d", source)  # the head dim is an argument now


def test_only_marked_sizes_can_become_runtime_arguments():
    text = "x3 = offsets % «128»\ny = 1e-05 * x3 + 0.5 - q_1 + 3 + «2048»\nz = tl.float32"
    spans = families.size_spans(text)
    assert [text[a:b] for a, b in spans] == ["«128»", "«2048»"]


def test_a_family_serves_only_members_equal_outside_their_sizes():
    family = families.Family(first=(128, 64, 2048, 2048))
    family.widen((128, 64, 4096, 4096))  # positions 2 and 3 moved together: one size
    assert family.groups == [[2, 3]]
    assert family.values((128, 64, 512, 512)) == [512]
    assert family.values((128, 32, 512, 512)) is None  # differs where the template has a constant
    assert family.values((128, 64, 512, 1024)) is None  # the shared size would need two values


def test_launch_records_tell_integer_specializations_apart():
    """Triton specializes an int argument on == 1 and on divisibility by 16: a binary
    compiled for one class must not be loaded for another."""
    classes = {records.int_class(v) for v in (1, 16, 4096, 17, 2**33)}
    assert len(classes) == 4 and records.int_class(16) == records.int_class(4096)


def test_a_value_literal_never_becomes_a_runtime_argument(device):
    """`x + k` on int8 with k = 100, then 50: a runtime int32 `s0` would compute in int32 (no
    wrap-around) and turn int8's 100 + 50 = -106 into 150 > 0. Values are constants of the text."""
    fn = minicomp.jit(lambda x, k: (x + k) > 0)
    x = torch.tensor([100, 1, -3], dtype=torch.int8, device=device)
    for k in (100, 50, 27):
        assert torch.equal(fn(x, k), (x + k) > 0)
    assert "s0" not in fn.source(x, 50) and "+ 50" in fn.source(x, 50)


def test_a_fill_value_stays_a_constant_while_sizes_vary(device):
    """Sizes (marked by the index code) vary in a family; the fill value of `full` does not."""
    fn = minicomp.jit(lambda x, v: x * 2 + torch.full_like(x, v))
    for n, v in [(8, 3), (16, 3), (24, 5)]:
        x = torch.arange(n * 4, dtype=torch.int32, device=device).reshape(n, 4)
        assert torch.equal(fn(x, v), x * 2 + v)
    assert "tl.full([BLOCK_SIZE], 5, tl.int32)" in fn.source(x, 5)


def test_families_belong_to_the_function_that_compiled_them(tmp_path, monkeypatch):
    """What one function saw never changes another's code: a fresh jit of the same
    function starts with every size a constant (in an empty cache: an entry on disk is
    served as it was compiled)."""
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path))
    first = minicomp.jit(w.rope)
    for seq in (8, 16):
        check_rope(first, rope_inputs(seq))
    assert "runtime sizes" in first.source(*rope_inputs(16))
    second = minicomp.jit(w.rope)
    check_rope(second, rope_inputs(16))
    assert "runtime sizes" not in second.source(*rope_inputs(16))


def test_runtime_sizes_are_not_specialized(device):
    """A family's sizes are `do_not_specialize`: one binary serves every later value, where Triton
    would compile one per class of the value (== 1, a multiple of 16: B * S at S = 504 after
    500-503; issue #42)."""
    fn = minicomp.jit(lambda x, y: x * 2 + y)
    sources = []
    for width in (32, 33, 48):  # the broadcast's width becomes `s0`, its class changing
        x, y = torch.randn(4, width, device=device), torch.randn(width, device=device)
        torch.testing.assert_close(fn(x, y), x * 2 + y)
        sources.append(fn.source(x, y))
    assert "do_not_specialize" not in sources[0]  # the first member keeps its constants
    # the counts 128 and 132 are of two classes: n_elements is not specialized either
    assert "@triton.jit(do_not_specialize=['s0', 'n_elements'])" in sources[1]
    assert kernel_text(sources[1]) == kernel_text(sources[2])  # and serves the later width


@pytest.mark.parametrize("rows", [(32, 33, 48, 7), (5, 16, 7, 64)])
def test_a_count_of_changing_class_is_not_specialized_from_then_on(rows, device):
    """A family's element or row count is `do_not_specialize` once its members' counts fall in two
    of Triton's classes (a multiple of 16, == 1, neither): the text made then serves every later
    class but the first member's, which keeps its specialized binary, where each would have been a
    binary of its own (issue #42: Llama's norm rows 4 * S at S = 1016 and 1008 after 1024 and 1023).
    Rows of a norm; elements of a contiguous pointwise kernel, whose text holds no size at all."""
    norm = minicomp.jit(lambda x: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6))
    scale = minicomp.jit(lambda x: x * 2 + 1)
    texts = []
    for n in rows:
        x, v = torch.randn(n, 64, device=device), torch.randn(n, device=device)
        torch.testing.assert_close(norm(x), x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6))
        torch.testing.assert_close(scale(v), v * 2 + 1)
        texts.append(["".join(kernel_text(fn.source(a))) for fn, a in ((norm, x), (scale, v))])
    first_class = records.int_class(rows[0])
    for kernel in range(2):
        first, second, *later = (t[kernel] for t in texts)
        assert "do_not_specialize" not in first  # a first member keeps its constants
        assert "'n_rows']" in second or "'n_elements']" in second
        for n, text in zip(rows[2:], later):  # the first member's class: its binary; else the loosened one
            assert text == (first if records.int_class(n) == first_class else second)


def test_a_count_of_one_class_keeps_the_first_members_text(device):
    """Counts that stay in one class (33-35 rows of 64 elements: multiples of 16) keep the first
    member's text and its binary: Triton's divisibility stays, so a pointwise kernel's masked loads
    stay 16-byte vectors."""
    fn = minicomp.jit(lambda x: x * 2 + 1)
    texts = []
    for rows in (33, 34, 35):
        x = torch.randn(rows, 64, device=device)
        torch.testing.assert_close(fn(x), x * 2 + 1)
        texts.append("".join(kernel_text(fn.source(x))))
    assert "do_not_specialize" not in texts[0] and texts[0] == texts[1] == texts[2]


def test_records_of_an_unspecialized_argument_key_its_type_alone():
    assert records.specializations([17, 32], frozenset({0})) == records.specializations([48, 32], frozenset({0}))
    assert records.specializations([17, 32]) != records.specializations([48, 32])


@pytest.mark.parametrize("negative", [False, True])
def test_a_bounds_check_joins_the_family(negative, device):
    """An index read from data is checked against its dim's size (lowering/ops/indexed.py
    `bounds`): that size is a marked size too, and the message names none, so a new length
    reuses the family's text (transformers' causal mask read `cumsum[..., i]` and was new text
    at every length); an index out of bounds still raises."""
    fn = minicomp.jit(lambda x, i: x[:, i] * 2)
    texts = []
    for n in (9, 11, 13, 17):
        x = torch.randn(3, n, device=device)
        i = torch.arange(n, device=device) - (n // 2 if negative else 0)
        torch.testing.assert_close(fn(x, i), x[:, i] * 2)
        texts.append(kernel_text(fn.source(x, i)))
    assert texts[1] == texts[2] == texts[3] and "s0" in texts[1][0]
    if device.type == "cpu":  # (a CUDA assert poisons the context)
        bad = torch.arange(13, device=device)
        bad[5] = 13
        with pytest.raises(IndexError, match="out of bounds for dimension 1"):
            fn(torch.randn(3, 13, device=device), bad)


def _softmax_scaled(x, w):
    return torch.softmax(x * w, dim=-1) + x[:, :1], (x.t() * 2).contiguous()


def test_through_torch_compile_the_second_length_joins_the_first_lengths_families(module_sources):
    """Dynamo compiles the first length as a static graph and the second as a dynamic one, which
    names its values anew (`arg1_1` for `arg0_1`): the second still joins the first's families
    (dispatch/frame_families.py; codegen/families.py `alpha_key`), so a kernel whose text the
    length does not change is the first's text, and the third length compiles no new text (#42)."""
    from minicomp.dispatch.dynamo import backend

    compiled = torch.compile(_softmax_scaled, backend=backend)
    texts = []
    for rows in (9, 10, 11, 12):
        x, w = torch.randn(rows, 16), torch.randn(16)
        torch.testing.assert_close(compiled(x, w), _softmax_scaled(x, w))
        texts.append(kernel_text(module_sources[-1]))
    softmax = [next(k for k in t if "amax" in k) for t in texts]
    transposed = [next(k for k in t if "permute" in k) for t in texts]
    assert softmax[0] == softmax[1] == softmax[3]  # the same text at every length (its rows are n_rows)
    assert ", s0," not in transposed[0] and ", s0," in transposed[1]  # x.t()'s rows: a runtime size
    assert texts[2] == texts[3] == texts[1]


def test_a_member_named_otherwise_is_served_its_familys_text():
    """Once a function is traced again, a kernel equal to a family's first member up to its locals'
    names (pointer parameters, assigned temporaries) is served the first member's text; one that
    differs otherwise is not."""
    from minicomp.codegen.kernel import KernelSource

    def member(x, y, out, tmp, op="+"):
        return KernelSource(
            kernel=None, name="mc_k_0", params=[f"{x}_ptr", f"{y}_ptr", "out_ptr"], args=[], numel=8, header=[],
            body=[f"{x} = tl.load({x}_ptr + offsets, mask=mask)", f"{y} = tl.load({y}_ptr + «4»*offsets, mask=mask)",
                  f"{tmp} = {x} {op} {y}", f"tl.store(out_ptr + offsets, {tmp}, mask=mask)"],
            wide_index=False,
        )  # fmt: skip

    plain = families.Families()  # a first trace: kernels are compared as written
    plain.generalize(member("a", "b", "out", "add"))
    assert plain.generalize(member("b", "c", "out", "add_6")).params == ["b_ptr", "c_ptr", "out_ptr"]
    fams = families.Families()
    first = fams.generalize(member("a", "b", "out", "add"))
    fams.match_renamed = True  # (traced again: dispatch/frame_families.py)
    renamed = fams.generalize(member("b", "c", "out", "add_6"))
    assert renamed.params == first.params and renamed.body == first.body
    swapped = fams.generalize(member("b", "a", "out", "add"))  # the same names, one to one otherwise
    assert swapped.body == first.body
    other = fams.generalize(member("a", "b", "out", "add", op="*"))
    assert other.body != first.body


@pytest.mark.parametrize(
    "sizes, same",
    [
        ([(2, 8), (2, 9), (4, 8)], ((2, 8), (4, 8))),  # the first text keeps its class's binary
        ([(2, 8), (2, 16), (3, 8), (2, 24)], ((2, 16), (2, 24))),  # and so does the template
    ],
)
def test_a_member_whose_class_its_text_has_compiled_keeps_that_text(sizes, same):
    """Binaries are per text (the first member's, the template's): a member served a text at a
    count class that text was compiled for keeps it (its binary), whatever classes members of the
    family's other text brought. x[B, S, 3] + y[S, 3]: y's index holds 3 * S (the template's
    size), the count is B * S * 3 (48, 54, 96; 48, 96, 72, 144). A review's finding: the count was
    loosened family-wide, a compile where the binary existed."""
    fn = minicomp.jit(lambda x, y: x + y)
    texts = {}
    for b, s in sizes:
        x, y = torch.randn(b, s, 3), torch.randn(s, 3)
        torch.testing.assert_close(fn(x, y), x + y)
        texts[b, s] = kernel_text(fn.source(x, y))
    assert texts[same[0]] == texts[same[1]]


@pytest.mark.parametrize("factor, loose", [(1, True), (2048, False)])
def test_a_probed_familys_count_is_loosened_at_its_first_compiled_member(factor, loose):
    """A family a probe size started (a dynamic graph's, capture/specialize.py) compiles its first
    real member's text anyway: where the counts share no factor of 16 (Llama's 4 * S norm rows at
    the probe S = 1007 and S = 1023) that text leaves the count unspecialized, so S = 1016 and 1008
    reuse it; counts that carry a factor of 2048 (4 * S * 2048) keep their divisibility."""
    from minicomp.codegen.reduction import ReductionSource

    def member(rows):
        return ReductionSource(
            kernel=None, name="mc_norm_0", params=["x_ptr", "out_ptr"], args=[], numel=rows * factor, header=[],
            body=["x = tl.load(x_ptr + «2048»*xindex + rindex, mask=xmask)",
                  "tl.store(out_ptr + xindex, x, mask=xmask)"],
            wide_index=False, rblock=2048, extent=2048,
        )  # fmt: skip

    fams = families.Families()
    fams.generalize(member(4 * 1007), probe=True)
    texts = [fams.generalize(member(4 * s)) for s in (1023, 1016, 1008, 1)]
    assert all(t.unspecialized == texts[0].unspecialized and t.body == texts[0].body for t in texts)
    assert texts[0].unspecialized == (["n_rows"] if loose else [])


def test_a_kernel_no_family_blanks_alike_is_looked_up_without_a_parse(monkeypatch):
    """Once traced again, a kernel that misses is keyed by `alpha_key` (a parse) only where some
    family of its name blanks alike (identifiers as `_`): a renamed member parses, one of another
    structure does not, and is still not served another's text."""
    from minicomp.codegen.kernel import KernelSource

    def member(x, tmp, op="+"):
        return KernelSource(
            kernel=None, name="mc_k_0", params=[f"{x}_ptr", "out_ptr"], args=[], numel=8, header=[],
            body=[f"{x} = tl.load({x}_ptr + offsets, mask=mask)", f"{tmp} = {x} {op} 1.0",
                  f"tl.store(out_ptr + «4»*offsets, {tmp}, mask=mask)"],
            wide_index=False,
        )  # fmt: skip

    parses = []
    key = families.alpha_key
    monkeypatch.setattr(families, "alpha_key", lambda *a: parses.append(a) or key(*a))
    fams = families.Families()
    first = fams.generalize(member("a", "add"))
    fams.match_renamed = True
    other = fams.generalize(member("a", "add", op="*"))
    assert parses == [] and other.body != first.body
    renamed = fams.generalize(member("b", "add_3"))
    assert len(parses) == 2 and renamed.body == first.body  # (the family's key, then the member's)


def test_another_function_starts_its_own_families(module_sources):
    """What one function saw never changes another's kernels: a second function of the same body
    starts with its sizes as constants."""
    from minicomp.dispatch.dynamo import backend

    def other(x, w):
        return torch.softmax(x * w, dim=-1) + x[:, :1], (x.t() * 2).contiguous()

    first = torch.compile(_softmax_scaled, backend=backend)
    for rows in (9, 10, 11):
        first(torch.randn(rows, 16), torch.randn(16))
    second = torch.compile(other, backend=backend)
    x, w = torch.randn(9, 16), torch.randn(16)
    torch.testing.assert_close(second(x, w), _softmax_scaled(x, w))
    assert "runtime sizes" not in module_sources[-1]


def test_a_reset_starts_a_functions_families_anew(module_sources):
    """After `torch._dynamo.reset()` a function's first compile is a first trace again: its sizes
    are constants, as they were the first time."""
    from minicomp.dispatch.dynamo import backend

    for rows in (9, 10):
        torch.compile(_softmax_scaled, backend=backend)(torch.randn(rows, 16), torch.randn(16))
    assert any(", s0," in k for k in kernel_text(module_sources[-1]))
    torch._dynamo.reset()
    x, w = torch.randn(11, 16), torch.randn(16)
    torch.testing.assert_close(torch.compile(_softmax_scaled, backend=backend)(x, w), _softmax_scaled(x, w))
    assert all(", s0," not in k for k in kernel_text(module_sources[-1]))


def _rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize(
    "fn, shape",
    [
        (lambda x, w: (x * w).sum(0), lambda n: (n, 64)),  # a column sum over the rows: a weight gradient's
        (lambda x, w: torch.softmax(x * w[:1], -1), lambda n: (2, 4100 + n)),  # a row longer than a loop step
    ],
    ids=["columns", "looped_rows"],
)
def test_a_reductions_row_length_is_a_size(fn, shape, device):
    """The length a reduction walks (`rmask = rindex < 82`, `range(0, 82, RBLOCK)`) is a marked size:
    a weight gradient's sum over B * S rows made new Triton text at every sequence length of a
    training step (Llama's backward, issue #42). Under the interpreter the runtime bound of a loop
    needs runtime/interpreter_index.py."""
    jitted = minicomp.jit(fn)
    texts = []
    # (lengths that are no multiple of 8: a multiple walks its row without a peeled last step, other
    # text of its own family; codegen/reduction.py)
    for n in (41, 43, 45, 47, 49):
        x, w = torch.randn(shape(n), device=device), torch.randn(64, device=device)
        torch.testing.assert_close(jitted(x, w), fn(x, w), atol=1e-5, rtol=1e-5)
        texts.append(kernel_text(jitted.source(x, w)))
    assert all(t == texts[1] for t in texts[2:]) and "s0" in "".join(texts[1])


def test_a_grouped_weight_gradient_joins_its_family(device):
    # RMSNorm's weight gradient is summed over the rows in row groups (split_reductions.py); the
    # rows a program takes change with the length and are a runtime size after the second
    fn = minicomp.jit(_rms_norm)
    texts = []
    for n in (84, 92, 100, 108, 116):
        x = torch.randn(n, 64, device=device, requires_grad=True)
        w = torch.randn(64, device=device, requires_grad=True)
        g = torch.randn(n, 64, device=device)
        got = torch.autograd.grad(fn(x, w), (x, w), g)
        expected = torch.autograd.grad(_rms_norm(x, w), (x, w), g)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        texts.append([k for k in kernel_text(fn.source(x, w)) if "xstart" in k])
    assert len(texts[1]) == 1 and "xstart = pid * s" in texts[1][0]  # the rows a program takes: a size
    assert all(t == texts[1] for t in texts[2:])


def _causal_attention(q, k, v):
    """SDPA under a [1, 1, L, L] additive causal mask a kernel writes (rows padded to 8 for SDPA)."""
    i = torch.arange(q.shape[-2], device=q.device)
    mask = torch.where(i[None, None, None, :] <= i[None, None, :, None], 0.0, float("-inf"))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_an_sdpa_mask_is_one_text_whether_or_not_its_rows_are_padded():
    """An attention mask a kernel writes for SDPA has its rows padded to 8 elements (plan/fusion.py
    `_aligned_masks`) where the length is not a multiple of 8, and none where it is: its store keeps
    the row apart in the index at every length (`Plan.row_bounded`), so a multiple of 8 is served
    the family's text instead of a new skeleton whose index collapsed to `offsets` (issue #42: a
    Triton compile at S = 1016 and another at 1008 in Llama's inference). On the CPU: traced on a
    GPU, SDPA's own decomposition pads the mask where the length needs it, so there the graphs of
    the lengths differ (Dynamo's symbolic trace of a model does not: the H200 run of session 35)."""
    fn = minicomp.jit(_causal_attention)
    texts = []
    for length in (13, 21, 16, 24, 19):  # rows padded to 16, 24, none, none, 24
        g = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(1, 2, length, 8, generator=g) for _ in range(3))
        with torch.no_grad():
            torch.testing.assert_close(fn(q, k, v), _causal_attention(q, k, v))
            texts.append(next(t for t in kernel_text(fn.source(q, k, v)) if "where" in t))
    assert all(t == texts[1] for t in texts[2:])  # the family's template at 16 and 24 too
    assert "tl.store(out_ptr + offsets," not in texts[2]
