"""Property tests: random shapes, broadcasts, strides, dtypes and view chains against eager."""

import torch
from conftest import check
from hypothesis import HealthCheck, given, settings
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
