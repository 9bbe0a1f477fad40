"""PyTorch's OpInfo database as a peer test suite: every elementwise op through minicomp.jit.

For each op in `unary_ufuncs` and `binary_ufuncs`, the first few float32 sample
inputs run eagerly and compiled; results must match. Ops minicomp does not
lower run as ATen calls inside the generated wrapper, so they must match too.
"""

import pytest
import torch

pytest.importorskip("expecttest", reason="torch's OpInfo database imports expecttest (not on the GPU machine)")
from torch.testing._internal.common_methods_invocations import binary_ufuncs, op_db, unary_ufuncs  # noqa: E402

import minicomp

SAMPLES_PER_OP = 3

# Each entry: why the compiled result may legitimately differ from eager.
EXPECTED_FAILURES = {
    # random: eager and compiled draw different random numbers (rrelu samples
    # its slopes with torch's RNG in training mode).
    "nn.functional.rrelu": "random op: draws differ between two runs",
}

OPS = [
    op
    for op in unary_ufuncs + binary_ufuncs
    if torch.float32 in op.supported_dtypes("cpu") and not op.name.startswith("_refs")
]


def _tensors_first(sample):
    args = [sample.input, *sample.args]
    return args, sample.kwargs


# Not run at all: these break the process for the tests after them.
SKIPPED = {
    # a jiterator op launches a real CUDA kernel on the fake tensors of the trace:
    # make_fx cannot trace it, and the failed launch poisons the CUDA context
    "jiterator_unary",
    "jiterator_binary",
    "jiterator_binary_return_by_ref",
    "jiterator_4inputs_with_extra_args",
}


@pytest.mark.parametrize("op", OPS, ids=lambda op: f"{op.name}.{op.variant_test_name}".rstrip("."))
def test_opinfo_matches_eager(op, device):
    if op.name in SKIPPED:
        pytest.skip("cannot be traced by make_fx; see SKIPPED")
    if op.name in EXPECTED_FAILURES:
        pytest.xfail(EXPECTED_FAILURES[op.name])
    if torch.float32 not in op.supported_dtypes(device.type):
        pytest.skip("float32 not supported by the op on this device")
    samples = list(op.sample_inputs(device, torch.float32))[:SAMPLES_PER_OP]
    for sample in samples:
        args, kwargs = _tensors_first(sample)

        def fn(*a, **k):
            return op(*a, **k)

        try:
            expected = fn(*args, **kwargs)
        except Exception:  # the sample is invalid for eager too: nothing to compare
            continue
        actual = minicomp.jit(fn)(*args, **kwargs)
        torch.testing.assert_close(
            actual, expected, equal_nan=True, atol=1e-5, rtol=1.3e-5, msg=lambda m: f"{op.name} on {sample}: {m}"
        )


# -- reductions -------------------------------------------------------------------------------
# The reductions, the ops decompositions build from them, and the scans: compiled in float32 and bfloat16,
# compared with eager run in float32 on the same (upcast) inputs.
REDUCTION_OPS = [
    "sum",
    "mean",
    "amax",
    "amin",
    "prod",
    "var",
    "std",
    "var_mean",
    "logsumexp",
    "softmax",
    "log_softmax",
    "norm",
    "linalg.vector_norm",
    "argmax",
    "argmin",
    "any",
    "all",
    "nn.functional.layer_norm",
    "nn.functional.rms_norm",
    "nn.functional.cross_entropy",
    "nn.functional.nll_loss",
    "nn.functional.group_norm",
    "cumsum",  # scans (lowering/ops/scans.py): a kernel kind of their own
    "cumprod",
    "logcumsumexp",
]
REDUCTIONS = [op for op in op_db if op.name in REDUCTION_OPS and not op.variant_test_name.startswith("_")]


def _upcast(value):
    if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
        return value.float()
    if isinstance(value, (list, tuple)):
        return type(value)(_upcast(v) for v in value)
    return value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("op", REDUCTIONS, ids=lambda op: f"{op.name}.{op.variant_test_name}".rstrip("."))
def test_opinfo_reductions_match_eager_in_float32(op, dtype, device):
    if dtype not in op.supported_dtypes(device.type):
        pytest.skip(f"{dtype} not supported by the op on this device")
    samples = list(op.sample_inputs(device, dtype))[:SAMPLES_PER_OP]
    for sample in samples:
        args, kwargs = _tensors_first(sample)

        def fn(*a, **k):
            return op(*a, **k)

        try:
            expected = fn(*_upcast(args), **_upcast(kwargs))
        except Exception:  # the sample is invalid for eager too: nothing to compare
            continue
        actual = minicomp.jit(fn)(*args, **kwargs)
        tolerance = dict(atol=1e-5, rtol=1.3e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(
            _upcast(actual),
            expected,
            equal_nan=True,
            check_dtype=False,
            **tolerance,
            msg=lambda m: f"{op.name} on {sample}: {m}",
        )
