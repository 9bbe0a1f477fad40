"""The module writer's def-before-use check (codegen/assigned.py): a generated function that reads a
name not assigned on every path before the read is refused as the module is written."""

from pathlib import Path

import pytest

from minicomp.codegen.assigned import UnassignedName, check_assigned, check_module

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
    checked = {}
    for _ in range(2):  # by pieces too, and again with what the first check kept (nothing for a failure)
        with pytest.raises(UnassignedName, match="generated function k reads"):
            check_module(kernel(body), [kernel(body)[len(HEAD) :]], checked)


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
    check_module(kernel(body), [kernel(body)[len(HEAD) :]], {})


def test_a_kernels_functions_are_checked_once_and_what_they_read_against_each_module(monkeypatch):
    """check_module keeps what a kernel's functions read from the module, by their text: a second
    module with the same kernel (a family's next size: only its launch line differs) parses none of
    its functions, yet a module that lacks a name they read is still refused."""
    from minicomp.codegen import assigned

    piece = "# kernel 0: mul\n" + kernel("tl.store(out_ptr, _sum(tl.load(x_ptr), 1))")[len(HEAD) :]
    parsed = []
    real = assigned.outside
    monkeypatch.setattr(assigned, "outside", lambda text: parsed.append(text) or real(text))
    checked = {}
    for launch in ("k_launch = (k, 64)\n", "k_launch = (k, 128)\n"):
        check_module(HEAD + piece + launch, [piece + launch], checked)
    assert len(parsed) == 1 and "# kernel" not in parsed[0]
    without_sum = HEAD.replace("def _sum", "def _other")
    with pytest.raises(UnassignedName, match="reads '_sum' which neither the function nor the module defines"):
        check_module(without_sum + piece, [piece], checked)
    assert len(parsed) == 1


def test_every_golden_module_passes():
    modules = sorted((Path(__file__).parents[1] / "golden" / "modules").glob("*.py"))
    assert modules
    for path in modules:
        check_assigned(path.read_text())


def test_a_module_that_does_not_parse_raises_its_syntax_error_by_pieces_too():
    """A kernel reading a local too early in a module whose wrapper does not parse: the whole
    module's verdict (its SyntaxError), not the kernel's, as check_assigned gives it."""
    piece = kernel("tl.store(out_ptr, y)\ny = 1")[len(HEAD) :]
    text = HEAD + piece + "\ndef call(x:\n    return x\n"
    with pytest.raises(SyntaxError):
        check_assigned(text)
    with pytest.raises(SyntaxError):
        check_module(text, [piece], {})


def test_kernels_whose_functions_differ_in_comment_lines_share_one_check():
    """A combined launch's functions carry each part's header comment (its sizes): the check is
    kept by the functions' text without top-level comment lines."""
    first = kernel("tl.store(out_ptr, _sum(tl.load(x_ptr), 1))")[len(HEAD) :]
    second = first.replace("def k(", "def k2(")
    checked = {}
    for size in (4, 5):
        piece = f"# part 0: iteration space [{size}]\n{first}# part 1: iteration space [{size}]\n{second}"
        check_module(HEAD + piece, [piece], checked)
    assert len(checked) == 1 and next(iter(checked.values())).defines == {"k", "k2"}


def test_every_module_of_a_function_at_three_sizes_passes_by_pieces(monkeypatch):
    """The modules minicomp writes, checked by pieces as render_module does, pass; at a third size
    (the kernels' family texts made at the second: codegen/families.py) the kernels' functions are
    read from what the earlier checks kept."""
    import torch

    import minicomp
    from minicomp.codegen import assigned, module

    parsed = []  # per module: the kernels' functions parsed alone
    real_outside, real_check = assigned.outside, assigned.check_module
    monkeypatch.setattr(assigned, "outside", lambda text: parsed[-1].append(text) or real_outside(text))

    def both(text, pieces, checked):
        check_assigned(text)
        parsed.append([])
        real_check(text, pieces, checked)

    monkeypatch.setattr(module, "check_module", both)
    fn = minicomp.jit(lambda x, w: torch.softmax((x @ w).relu() * 2, -1).sum(0) + w.mean())
    for rows in (12, 13, 14):
        x, w = torch.randn(rows, 16), torch.randn(16, 20)
        torch.testing.assert_close(fn(x, w), torch.softmax((x @ w).relu() * 2, -1).sum(0) + w.mean())
    assert [len(p) > 0 for p in parsed] == [True, True, False]


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

    def flaky(text, pieces, checked):
        calls.append(text)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=267, after=344)")
        check_module(text, pieces, checked)

    monkeypatch.setattr(module, "check_module", flaky)
    x = torch.randn(5, 7)
    torch.testing.assert_close(minicomp.jit(lambda t: (t * 3).relu() + 1)(x), (x * 3).relu() + 1)
    assert len(calls) == 2

    def broken(text, pieces, checked):
        raise SystemError("another internal error")

    monkeypatch.setattr(module, "check_module", broken)
    with pytest.raises(CompileError, match="another internal error"):
        minicomp.jit(lambda t: (t * 5).sigmoid(), fallback="raise")(x)
