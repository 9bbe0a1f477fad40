"""Property tests: random shapes, broadcasts, strides, dtypes and view chains against eager."""

import math

import torch
from conftest import check
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.bool])


@st.composite
def strided_tensor(draw, ndim=None, dtype=None):
    """A tensor of random shape with permuted strides, maybe sliced (non-contiguous)."""
    ndim = draw(st.integers(0, 4)) if ndim is None else ndim
    shape = draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim))
    dtype = draw(DTYPES) if dtype is None else dtype
    perm = draw(st.permutations(range(ndim)))
    step = draw(st.sampled_from([1, 2]))
    big = [s * step if i == ndim - 1 else s for i, s in enumerate(shape)]
    base = torch.randn([big[p] for p in perm]) * 4
    base = base.to(dtype) if dtype != torch.bool else base > 0
    t = base.permute([perm.index(i) for i in range(ndim)])
    if ndim and step > 1:
        t = t[..., ::step]
    return t


@SETTINGS
@given(strided_tensor(), st.data())
def test_binary_ops_broadcast_over_random_layouts(x, data):
    # a broadcastable partner: drop leading dims, set some dims to 1
    keep = data.draw(st.integers(0, x.ndim))
    shape = [1 if data.draw(st.booleans()) else s for s in x.shape[x.ndim - keep :]]
    y = torch.randn(shape) * 3
    fn = data.draw(
        st.sampled_from(
            [
                lambda a, b: a + b,
                lambda a, b: a * b - 1,
                lambda a, b: torch.where(a > 0, b, a * 2),
                lambda a, b: torch.maximum(a, b),
                lambda a, b: (a.float() / (b.abs() + 1)).to(a.dtype if a.dtype != torch.bool else torch.float32),
            ]
        )
    )
    print(f"repro: x {x.dtype} {list(x.shape)} stride {x.stride()}, y {list(y.shape)}")
    check(fn, x, y)


@SETTINGS
@given(strided_tensor(ndim=3, dtype=torch.float32), st.data())
def test_random_view_slice_cat_chains(x, data):
    ops = data.draw(
        st.lists(st.sampled_from(["t", "slice", "flip", "cat", "unsqueeze", "tanh", "reshape"]), min_size=1, max_size=4)
    )

    def chain(x):
        for op in ops:
            if op == "t":
                x = x.transpose(0, -1)
            elif op == "slice":
                x = x[..., 1:] if x.shape[-1] > 1 else x
            elif op == "flip":
                x = x.flip(-1)
            elif op == "cat":
                x = torch.cat([x, -x], dim=0)
            elif op == "unsqueeze":
                x = x.unsqueeze(1).squeeze(1)
            elif op == "tanh":  # bounded: chained exp would amplify rounding past any tolerance
                x = torch.tanh(x) * 2
            elif op == "reshape":
                x = x.reshape(-1)
        return x * 2

    print(f"repro: ops {ops} on {list(x.shape)} stride {x.stride()}")
    check(chain, x, kernels=1)


@SETTINGS
@given(st.lists(st.integers(1, 5), min_size=2, max_size=3), st.integers(1, 4), st.integers(1, 5), st.data())
def test_planes_side_by_side_cover_every_element_once(lead, tail, group, data):
    """codegen/plane_order.py on random planes: the kernel launched by hand at a block of 16
    (several blocks a plane, the last partial; a last group of planes padded), its output
    filled with NaN first, against eager. `tail` dims the broadcast input spans."""
    import minicomp
    from minicomp import config

    inner = [data.draw(st.integers(1, 12)) for _ in range(tail)]
    assume(math.prod(lead) > 1 and math.prod(inner) > 1)
    assume(math.prod(lead) * math.prod(inner) <= 4096)  # (the interpreter runs each of the 16-element blocks)
    x, y = torch.randn(*lead, *inner), torch.randn(*inner)
    fn = lambda a, b: a * b + 1  # noqa: E731
    with config.override(reuse_bytes=0, plane_group=group):
        compiled = minicomp.jit(fn).compiled(x, y)
    [call] = compiled.kernels
    launch = compiled.launch(call)
    assert launch.spec.planes > 1 and "side by side" in compiled.source
    args = compiled.bare_arguments(call, [x, y])
    [out] = [a for a, name in zip(args, call.buffers) if name in call.writes]
    out.fill_(float("nan"))
    launch.kernel[(launch.grid(16),)](*args, BLOCK_SIZE=16, num_warps=1)
    torch.testing.assert_close(out, fn(x, y))
