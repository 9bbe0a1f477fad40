"""Views, slices, cat and stack lower to index arithmetic: RoPE in every form is one kernel."""

import pytest
import torch
import workloads as w
from conftest import aten_call, check

import minicomp

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_q_and_k_share_one_kernel(device, dtype):
    q, k = (torch.randn(2, 3, 5, 8, device=device, dtype=dtype) for _ in range(2))
    cos, sin = (torch.randn(5, 8, device=device, dtype=dtype) for _ in range(2))
    source = check(w.rope, q, k, cos, sin, kernels=1)
    # rotate_half is two masked loads of q at shifted offsets, not a copy
    assert "q_ptr + (offsets + 4)" in source and "q_ptr + (offsets - 4)" in source


def test_rope_grouped_query_attention_is_one_launch(device):
    """q and k of different head counts are two iteration spaces, so two kernels, in one launch:
    each a @triton.jit function called by the programs of its range (templates/combo.py.j2)."""
    q = torch.randn(2, 8, 5, 16, device=device)
    k = torch.randn(2, 2, 5, 16, device=device)  # fewer k heads
    cos, sin = torch.randn(5, 16, device=device), torch.randn(5, 16, device=device)
    source = check(w.rope, q, k, cos, sin, kernels=1)
    assert "pieces=(" in source and "if pid < first:" in source


def test_dependent_or_reduction_kernels_keep_their_own_launches(device):
    x, v = torch.randn(6, 32, device=device), torch.randn(6, 8, device=device)
    check(lambda x, v: (torch.softmax(x, -1) * 2, v.exp()), x, v, kernels=2)  # a reduction kernel
    check(lambda x, v: ((x * 2) @ torch.ones(32, 8, device=x.device)).exp() + v, x, v, kernels=2)  # mm between


@pytest.mark.parametrize("layout", ["SD", "BSD-unsqueeze", "11SD"])
def test_rope_cos_sin_layouts(device, layout):
    B, H, S, D = 2, 3, 7, 10
    q, k = torch.randn(B, H, S, D, device=device), torch.randn(B, H, S, D, device=device)
    cos, sin = torch.randn(B, S, D, device=device), torch.randn(B, S, D, device=device)

    def rope_bsd(q, k, cos, sin):
        return w.rope(q, k, cos.unsqueeze(1), sin.unsqueeze(1))

    if layout == "SD":
        check(w.rope, q, k, cos[0], sin[0], kernels=1)
    elif layout == "BSD-unsqueeze":
        check(rope_bsd, q, k, cos, sin, kernels=1)
    else:
        check(w.rope, q, k, cos[0][None, None], sin[0][None, None], kernels=1)


def test_rope_reads_transposed_q_in_place(device):
    B, S, H, D = 2, 6, 3, 8
    q = torch.randn(B, S, H, D, device=device).transpose(1, 2)  # [B, H, S, D] view, non-contiguous
    k = torch.randn(B, S, H, D, device=device).transpose(1, 2)
    cos, sin = torch.randn(S, D, device=device), torch.randn(S, D, device=device)
    source = check(w.rope, q, k, cos, sin, kernels=1)
    assert "contiguous" not in source and "clone" not in source.split("def call")[1]


def test_partial_rotary(device):
    def partial_rope(q, cos, sin, r: int = 6):
        rot, passthrough = q[..., :r], q[..., r:]
        return torch.cat((rot * cos + w.rotate_half(rot) * sin, passthrough), dim=-1)

    q = torch.randn(2, 3, 5, 16, device=device)
    cos, sin = torch.randn(5, 6, device=device), torch.randn(5, 6, device=device)
    check(partial_rope, q, cos, sin, kernels=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_interleaved_rope(device, dtype):
    def rope_interleaved(x, cos, sin):
        x1, x2 = x[..., ::2], x[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
        return x * cos.repeat_interleave(2, -1) + rotated * sin.repeat_interleave(2, -1)

    x = torch.randn(2, 3, 5, 12, device=device, dtype=dtype)
    cos, sin = (torch.randn(5, 6, device=device, dtype=dtype) for _ in range(2))
    check(rope_interleaved, x, cos, sin, kernels=1)


def test_rope_odd_sizes(device):
    q, k = torch.randn(1, 73, 3, 92, device=device), torch.randn(1, 73, 3, 92, device=device)
    cos, sin = torch.randn(3, 92, device=device), torch.randn(3, 92, device=device)
    check(w.rope, q, k, cos, sin, kernels=1)


def test_view_family(device):
    x = torch.randn(4, 6, 5, device=device)
    fns = [
        lambda x: x.view(24, 5) * 2,
        lambda x: x.reshape(4, 30).t() + 1,
        lambda x: x.flatten() - 1,
        lambda x: x.unflatten(1, (2, 3)) * 3,
        lambda x: x.permute(2, 0, 1) * x.permute(2, 0, 1),
        lambda x: x.transpose(0, 2).exp(),
        lambda x: x.unsqueeze(1).squeeze(1) + 1,
        lambda x: x.select(1, -2) * 2,
        lambda x: x.narrow(2, 1, 3) + 1,
        lambda x: x.flip(0, 2) * 2,
        lambda x: x[:, 1:5:2, :: -1 if False else 2] * 2,
        lambda x: x[..., -3:] + x[..., :3],
        lambda x: x[:, -100:2] * 2,
        lambda x: x.view(4, 6, 5, 1).squeeze() + 1,
        lambda x: x.expand(2, 4, 6, 5) * 1.5,
        lambda x: x[None, :, None] * 2,
        lambda x: x.T.contiguous() + 1,
        lambda x: x.repeat_interleave(3, dim=1) * 2,
    ]
    for fn in fns:
        check(fn, x, kernels=1)
    check(lambda x: x[:, 100:] + 1, x, kernels=0)  # out-of-range start: empty, nothing to launch


def test_split_chunk_unbind(device):
    x = torch.randn(6, 8, device=device)
    check(lambda x: [p * 2 for p in x.split(3, dim=1)], x, kernels=1)  # widths 3, 3, 2: two shapes, one launch
    check(lambda x: [p + i for i, p in enumerate(x.chunk(3, dim=0))], x, kernels=1)
    check(lambda x: sum(p * p for p in x.unbind(1)), x, kernels=1)
    check(lambda x: x.split([1, 2, 5], dim=1)[2].exp(), x, kernels=1)


def test_cat_and_stack(device):
    a, b = torch.randn(3, 4, device=device), torch.randn(3, 2, device=device)
    c = torch.randn(3, 4, device=device, dtype=torch.float16)
    empty = torch.randn(3, 0, device=device)
    check(lambda a, b, c, e: torch.cat([a, b, c, e, a * 2], dim=1) + 1, a, b, c, empty, kernels=1)
    check(lambda a, c: torch.stack([a, c, a.exp()], dim=1) * 2, a, c, kernels=1)
    check(lambda a: torch.cat([a, torch.tensor([], device=a.device)]) * 2, a.flatten(), kernels=1)


def test_views_of_computed_values(device):
    x = torch.randn(4, 6, device=device)
    check(lambda x: (x * 2).t().reshape(3, 8)[1:, ::2].exp(), x, kernels=1)
    check(lambda x: torch.cat([(x + 1)[:, :3], (x * 2).flip(1)], dim=1).sin(), x, kernels=1)


def test_constant_pad_and_slice_backward(device):
    x = torch.randn(3, 5, device=device)
    check(lambda x: torch.nn.functional.pad(x, (2, 1, 0, 1), value=0.5) * 2, x, kernels=1)
    g = torch.randn(3, 3, device=device)
    check(lambda g: torch.ops.aten.slice_backward(g * 2, [3, 7], 1, 1, 6, 2) + 1, g, kernels=1)
    g = torch.randn(3, 2, device=device)
    check(lambda g: torch.ops.aten.slice_backward(g, [3, 9], 1, -4, 1000, 2) - 1, g, kernels=1)


def test_data_dependent_index_is_a_load_in_the_kernel(device):
    """x[i] reads x at positions i holds, in the kernel that reads it (it was an ATen call and a
    second kernel); tests/e2e/test_indexed_loads.py has the forms."""
    x = torch.randn(5, 4, device=device)
    idx = torch.tensor([4, 0, 2], device=device)
    source = check(lambda x, i: x[i] * 2 + 1, x, idx, kernels=1)
    assert not aten_call(source, "index")


def test_a_copy_read_by_aten_through_a_view_is_written_once(device):
    """GQA's repeat_kv: the expanded k is a clone the caller keeps ([B, K, G, S, D]) and a matmul
    reads as [B, H, S, D]; one kernel writes it once and the matmul takes an ATen view of it (the
    decoder block's forward wrote both shapes, in two kernels: 64 MiB more a step)."""
    k, w = torch.randn(2, 2, 5, 8, device=device), torch.randn(8, 8, device=device)

    def repeat_kv(k, w):
        r = (k * 2)[:, :, None].expand(2, 2, 3, 5, 8).clone()
        return r.reshape(2, 6, 5, 8) @ w, r

    source = check(repeat_kv, k, w, kernels=1)
    assert "= reinterpret(clone, (60, 8), (8, 1), 0)" in source  # the matmul's operand: a view of it, not a copy


@pytest.mark.parametrize(
    "name, kernels",
    [("rope_gqa", 1), ("rope_neox_partial", 1), ("rope_gptj", 1)],  # GQA: two kernels, one launch
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_forms_of_real_models(device, name, kernels, dtype):
    """The bench's RoPE forms (issue #18) at a tiny sequence: Llama with GQA on transposed q/k,
    GPT-NeoX's partial rotary, GPT-J's interleaved pairs, against eager."""
    from minicomp.tools.workloads import WORKLOADS

    work = WORKLOADS[name]
    inputs = work.make(3, dtype, device)
    call = check(work.fn, *inputs, kernels=kernels).split("def call(")[1]
    assert "torch.ops" not in call and "contiguous(" not in call  # no ATen copies of q, k


def test_an_address_read_under_complementary_conditions_is_loaded_once(device):
    """GPT-NeoX's partial rotary reads q's first 32 dims to rotate them and the rest to pass them
    through: one load of q at its own address, not one per part (1.069x -> 1.026x the floor in
    float32 on an H200). A part read under one condition only keeps it: no extra bytes."""
    from minicomp.tools.workloads import rope_neox_partial

    q, k = (torch.randn(2, 3, 5, 128, device=device) for _ in range(2))
    cos, sin = (torch.randn(5, 32, device=device) for _ in range(2))
    source = check(rope_neox_partial, q, k, cos, sin, kernels=1)
    assert source.count("tl.load(q_ptr + offsets, mask=mask, other=0)") == 1
    assert "tl.load(q_ptr + offsets, mask=mask &" not in source
    x, y = torch.randn(4, 100, device=device), torch.randn(4, 100, device=device)
    source = check(lambda x, y: torch.cat([x[:, :37] * 2, y[:, 37:]], dim=1), x, y, kernels=1)
    assert "tl.load(x_ptr + offsets, mask=mask & (x1 < 37)" in source  # 37 of x's 100 columns


@pytest.mark.parametrize("name", ["rope_gqa_fwbw", "rope_neox_partial_fwbw", "rope_gptj_fwbw"])
def test_rope_forms_of_real_models_backward(device, name):
    """The bench's RoPE forms, forward and backward: q's and k's gradients against eager."""
    from minicomp.tools.workloads import WORKLOADS

    work = WORKLOADS[name]
    inputs = work.make(3, torch.float32, device)
    eager = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    outs = minicomp.jit(work.fn, fallback="raise")(*inputs)
    grads = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, grads)
    torch.autograd.backward(work.fn(*eager), grads)
    for got, want in zip(inputs[:2], eager[:2]):
        torch.testing.assert_close(got.grad, want.grad)


def test_gradients_of_transposed_leaves_are_written_in_their_layout(device):
    """q and k as views of [B, S, H, D] projections: the backward writes their gradients with the
    leaves' strides, so autograd does not copy them into that layout (on an H200 the copy took
    912 us of a step whose kernels took 324)."""
    from minicomp.tools.workloads import WORKLOADS

    inputs = WORKLOADS["rope_gqa_fwbw"].make(3, torch.float32, device)
    fn = minicomp.jit(w.rope, fallback="raise")
    torch.autograd.backward(fn(*inputs), [torch.ones(t.shape, device=device) for t in inputs[:2]])
    backward = fn.entry(*inputs).backward.source
    for leaf in inputs[:2]:
        assert f"{tuple(leaf.shape)}, {leaf.stride()}" in backward
        assert leaf.grad.stride() == leaf.stride()


@pytest.mark.parametrize("entry", ["jit", "torch.compile"])
def test_the_backward_takes_tangents_in_the_outputs_layout(device, entry, monkeypatch):
    """AOTAutograd of torch 2.11 traces the backward for contiguous tangents (its
    `guess_tangent_strides_as_outputs` is False there): a transposed output's gradient was copied
    to contiguous before each backward and the backward then read it across its layout (RoPE GQA
    forward + backward 1.9x the floor in float32). minicomp traces with the output's layout."""
    import torch._functorch.config as functorch_config

    from minicomp.tools.workloads import WORKLOADS

    if not hasattr(functorch_config, "guess_tangent_strides_as_outputs"):
        pytest.skip("this torch has no tangent layout guess")
    monkeypatch.setattr(functorch_config, "guess_tangent_strides_as_outputs", False)
    inputs = WORKLOADS["rope_gqa_fwbw"].make(3, torch.float32, device)
    eager = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    seen = []
    if entry == "jit":
        fn = minicomp.jit(w.rope, fallback="raise")
    else:
        torch._dynamo.reset()
        fn = torch.compile(w.rope, backend=_recording_backend(seen))
    outs = fn(*inputs)
    grads = [torch.randn_like(o) for o in outs]  # laid out like the outputs: transposed
    torch.autograd.backward(outs, grads)
    torch.autograd.backward(w.rope(*eager), grads)
    backward = fn.entry(*inputs).backward.fx if entry == "jit" else seen[-1]
    tangents = [n.meta["val"] for n in backward.graph.nodes if n.name.startswith("tangents")]
    assert [t.stride() for t in tangents] == [o.stride() for o in outs]
    for got, want in zip(inputs[:2], eager[:2]):
        torch.testing.assert_close(got.grad, want.grad)


def _recording_backend(seen):
    """minicomp's Dynamo backend, keeping each graph minicomp compiles (the backward last)."""
    from minicomp import pipeline as compiler
    from minicomp.dispatch import dynamo

    def backend(gm, example_inputs):
        original = compiler.compile_graph

        def recording(graph, *args, **kwargs):
            seen.append(graph)
            return original(graph, *args, **kwargs)

        dynamo.compile_graph = recording
        try:
            return dynamo.backend(gm, example_inputs)
        finally:
            dynamo.compile_graph = original

    return backend


def test_a_value_of_the_padding_alone_is_a_tile(device):
    # the last two columns of the pad lie wholly in the padding: their value is the pad's
    # constant, written as a tile (a bare Python float made `isnan(v) | ...` a Python bool)
    x = torch.randn(4, 6, device=device)

    def f(x):
        tail = torch.nn.functional.pad(x, (0, 4), value=float("-inf"))[..., -2:]
        return torch.isnan(tail) | (x[..., :2] > 0)

    check(f, x)


def _call(source: str) -> str:
    return source[source.index("def call_boxed") :]


VIEW_CHAINS = {
    # a fused projection split three ways, each head-split and transposed for a matmul (GPT-2's qkv)
    "split_heads": lambda x, w: [
        t.view(2, 5, 2, 4).permute(0, 2, 1, 3) @ w[0, :4, :3]
        for t in (x @ torch.ones(8, 24, device=x.device)).split(8, -1)
    ],
    "slice_negative_start": lambda x, w: x.mm(torch.ones(8, 12, device=x.device))[:, -7:-1].t() @ x,
    "select_negative": lambda x, w: (x @ torch.ones(8, 8, device=x.device)).view(2, 5, 8)[:, -2] @ w[0],
    "narrow_unbind": lambda x, w: [t @ w[0] for t in (x @ w[1]).narrow(0, 2, 6).view(3, 2, 8).unbind(1)],
    "chunk_transpose": lambda x, w: [t.transpose(0, 1) @ x for t in (x @ w[1]).chunk(2, 1)],
    "expand_squeeze": lambda x, w: (x @ w[1])[None].expand(3, 10, 8).squeeze(0) @ w[0],
}


@pytest.mark.parametrize("name", sorted(VIEW_CHAINS))
def test_views_read_by_aten_are_made_from_their_root_buffer(device, name):
    """Chains of views (split, getitem, view, permute, slice, select, narrow, unbind, chunk,
    expand) that only ATen calls read are made by one `reinterpret` of the buffer at the root of
    the chain, at the offset the meta kernels give (codegen/view_layouts.py): no ATen view call,
    no layout check of its result, no view in between; results as eager's."""
    torch.manual_seed(0)
    x, w = torch.randn(10, 8, device=device), torch.randn(2, 8, 8, device=device)
    call = _call(check(VIEW_CHAINS[name], x, w))
    viewing = ("split", "slice", "select", "narrow", "unbind", "chunk", "expand", "transpose", "permute", "squeeze")
    assert not any(f"aten.{op}" in call for op in viewing), call
    lines = call.splitlines()
    product = next(i for i, line in enumerate(lines) if aten_call(line, "mm.default"))
    assert "conform(" not in lines[product + 1], call  # its result's layout is the meta kernel's
    for line in call.splitlines():
        if "= reinterpret(" in line:
            root = line.split("reinterpret(")[1].split(",")[0]
            assert not any(other.strip().startswith(f"{root} = reinterpret(") for other in call.splitlines()), line


def test_split_heads_offsets(device):
    """GPT-2's qkv: q, k and v are the fused product's memory at offsets 0, 8 and 16, made directly."""
    x, w = torch.randn(10, 8, device=device), torch.randn(2, 8, 8, device=device)
    source = check(VIEW_CHAINS["split_heads"], x, w)
    made = [line.strip() for line in _call(source).splitlines() if "= reinterpret(mm," in line]
    offsets = sorted(int(line.rstrip(")").rsplit(",", 1)[1]) for line in made)
    assert offsets == [0, 8, 16], made


def test_a_view_of_another_dtype_is_not_reinterpreted():
    """`view(dtype)` keeps its ATen call: `reinterpret` keeps its base's dtype."""
    x = torch.randn(4, 6)
    call = _call(check(lambda x: (x * 2).view(torch.int32) @ torch.ones(6, 2, dtype=torch.int32), x))
    assert "aten.view.dtype" in call


def test_views_of_an_input_at_a_storage_offset(device):
    """A view made from an input that starts inside its storage (a slice a caller passes): the
    offset is counted from the input's own start (`reinterpret` adds it to the input's)."""
    big, w = torch.randn(14, 8, device=device), torch.randn(8, 3, device=device)

    def fn(x, w):
        return [t.t() @ t @ w for t in x.split([4, 6], 0)]

    x = big[4:]  # storage offset 32
    got, want = minicomp.jit(fn)(x, w), fn(x, w)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    call = _call(minicomp.jit(fn).source(x, w))
    assert "aten.split" not in call and "= reinterpret(x," in call, call


def test_a_kernel_is_written_again_only_where_its_survey_can_change_it(monkeypatch):
    """A pointwise kernel is written a second time only where the first writing found an address
    loaded under two sets of conditions (or a dim walked as interleaved pairs), a looped reduction
    only where an address is loaded by two of its passes: other kernels' second writing was their
    first one's text (a layer's codegen, issue #42)."""
    from minicomp import config
    from minicomp.codegen import pointwise, reduction
    from minicomp.tools.workloads import rope_neox_partial

    writes = {"pointwise": 0, "reduction": 0}
    for kind, writer in (("pointwise", pointwise.PointwiseWriter), ("reduction", reduction.ReductionWriter)):
        monkeypatch.setattr(
            writer, "write", lambda self, real=writer.write, k=kind: writes.__setitem__(k, writes[k] + 1) or real(self)
        )

    def written(fn, *args, looped=False):
        writes.update(pointwise=0, reduction=0)
        source = check(fn, *args, kernels=1)
        assert not looped or "for roffset in range(" in source
        return dict(writes)

    x = torch.randn(4, 100)
    assert written(lambda x: (x * 2).relu(), x) == {"pointwise": 1, "reduction": 0}
    q, k = torch.randn(2, 3, 5, 128), torch.randn(2, 3, 5, 128)
    cos, sin = torch.randn(5, 32), torch.randn(5, 32)
    assert written(rope_neox_partial, q, k, cos, sin)["pointwise"] == 2  # q at one address under x3 < 32 and >= 32
    rows = torch.randn(4, 300)
    with config.override(persistent_rows=64):  # rows of 300 loop
        assert written(lambda x: x.sum(-1), rows, looped=True)["reduction"] == 1  # one pass
        assert written(lambda x: torch.softmax(x, -1), rows, looped=True)["reduction"] == 2  # the row read again
