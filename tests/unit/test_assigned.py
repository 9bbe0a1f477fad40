"""The module writer's def-before-use check (codegen/assigned.py): a generated function that reads a
name not assigned on every path before the read is refused as the module is written."""

from pathlib import Path

import pytest

from minicomp.codegen.assigned import UnassignedName, check_assigned

HEAD = """
import triton
import triton.language as tl


@triton.jit
def _sum(a, b):
    return a + b


"""

# issue #43: a reduction kernel loading under a row condition that its lines assign only later
MAMBA_KERNEL = (
    HEAD
    + """
@triton.jit
def mc_fused_slice_scatter_sum_0(b_ptr, a_ptr, out_ptr, n_rows, XBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < n_rows
    RBLOCK: tl.constexpr = 16
    x0 = xindex
    rindex = tl.arange(0, RBLOCK)[None, :]
    rmask = tl.full([1, RBLOCK], True, tl.int1)
    r0 = rindex
    b = tl.load(b_ptr + (((x0 + 1) // 2) - 1), mask=xmask & slice_scatter_tmp, other=0)
    a = tl.load(a_ptr + (16*x0 + r0), mask=xmask & rmask, other=0)
    slice_scatter_tmp = (x0 >= 1) & ((x0 - 1) % 2 == 0)
    slice_scatter = tl.where(slice_scatter_tmp, b, a * 2.0)
    sum_1 = tl.reduce(tl.where(rmask, slice_scatter, 0.0), 1, _sum)[:, None]
    tl.store(out_ptr + x0, sum_1, mask=xmask)
"""
)


def kernel(body: str, params: str = "x_ptr, out_ptr, n_rows") -> str:
    lines = "\n".join("    " + line for line in body.strip().splitlines())
    return HEAD + f"@triton.jit\ndef k({params}):\n{lines}\n"


def test_the_mamba_kernel_is_refused():
    with pytest.raises(UnassignedName, match=r"mc_fused_slice_scatter_sum_0 reads 'slice_scatter_tmp' before"):
        check_assigned(MAMBA_KERNEL)


def test_the_same_kernel_in_order_passes():
    fixed = MAMBA_KERNEL.replace("    slice_scatter_tmp = (x0 >= 1) & ((x0 - 1) % 2 == 0)\n", "").replace(
        "    b = tl.load", "    slice_scatter_tmp = (x0 >= 1) & ((x0 - 1) % 2 == 0)\n    b = tl.load"
    )
    check_assigned(fixed)


@pytest.mark.parametrize(
    "body",
    [
        # assigned in one branch only
        "if n_rows > 4:\n    y = 1\ntl.store(out_ptr, y)",
        # assigned inside a loop that may not run, read after it
        "for roffset in range(0, n_rows, 4):\n    acc = roffset\ntl.store(out_ptr, acc)",
        # read in the loop before the loop assigns it
        "for roffset in range(0, n_rows, 4):\n    acc = acc + roffset\n    acc = 0",
        # deleted, then read
        "y = 1\ndel y\ntl.store(out_ptr, y)",
        # defined nowhere
        "tl.store(out_ptr, _not_a_helper(x_ptr))",
    ],
)
def test_reads_not_assigned_on_every_path_are_refused(body):
    with pytest.raises(UnassignedName):
        check_assigned(kernel(body))


@pytest.mark.parametrize(
    "body",
    [
        "if n_rows > 4:\n    y = 1\nelse:\n    y = 2\ntl.store(out_ptr, y)",
        "if n_rows > 4:\n    y = 1\nelse:\n    return\ntl.store(out_ptr, y)",
        "acc = 0\nfor roffset in range(0, n_rows, 4):\n    acc = acc + roffset\ntl.store(out_ptr, _sum(acc, 1))",
        "_, best = tl.reduce((x_ptr, x_ptr), 1, _sum)\ny = [best * i for i in range(2)]\ntl.store(out_ptr, y)",
    ],
)
def test_reads_assigned_on_every_path_pass(body):
    check_assigned(kernel(body))


def test_every_golden_module_passes():
    modules = sorted((Path(__file__).parents[1] / "golden" / "modules").glob("*.py"))
    assert modules
    for path in modules:
        check_assigned(path.read_text())


@pytest.mark.parametrize(
    "body, ok",
    [
        ("(a, *b), c = x_ptr, [1, 2]\nd = e = c\ntl.store(out_ptr, a + b[0] + d + e + n_rows)", True),  # targets
        ("y = tl.load(x_ptr + (z := n_rows))\ntl.store(out_ptr + z, y)", True),  # a walrus in a call binds
        ("y = tl.load(x_ptr + (z := n_rows))\ntl.store(out_ptr + w, y)", False),
        ("y = tl.load(x_ptr + tl.arange(0, n_rows))\ntl.store(out_ptr, y + tl.sum(y))", True),
    ],
)
def test_names_bound_by_targets_and_by_a_walrus(body, ok):
    """`_stored` enters expressions other than targets only where the text has a `:=` (a long
    generated wrapper's calls are not walked); either way the same names are bound."""
    if ok:
        check_assigned(kernel(body))
    else:
        with pytest.raises(UnassignedName, match="'w'"):
            check_assigned(kernel(body))


def test_a_spurious_ast_error_is_compiled_again(monkeypatch):
    """Regression (CI, Python 3.11.7): CPython's `ast` raised "AST constructor recursion depth
    mismatch" in a compile's parse (cpython#106905, a counter the process shares): the stage that
    parses runs once more. Any other SystemError is the compile's failure, as before."""
    import torch

    import minicomp
    from minicomp.codegen import module
    from minicomp.dispatch.fallback import CompileError

    calls = []

    def flaky(text):
        calls.append(text)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=267, after=344)")
        check_assigned(text)

    monkeypatch.setattr(module, "check_assigned", flaky)
    x = torch.randn(5, 7)
    torch.testing.assert_close(minicomp.jit(lambda t: (t * 3).relu() + 1)(x), (x * 3).relu() + 1)
    assert len(calls) == 2

    def broken(text):
        raise SystemError("another internal error")

    monkeypatch.setattr(module, "check_assigned", broken)
    with pytest.raises(CompileError, match="another internal error"):
        minicomp.jit(lambda t: (t * 5).sigmoid(), fallback="raise")(x)
