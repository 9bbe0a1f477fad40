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
