"""`indexing.same_address`: two spellings of one offset are equal at every point; a near miss is not."""

from minicomp.lowering.indexing import Expr, FloorDiv, Mod, Var, same_address

X, R = Var(0, 16), Var(1, 128)


def _x() -> Expr:
    return Expr.of(X)


def test_a_view_and_its_flat_tensor_name_the_same_elements():
    flat = _x() * 128 + Expr.of(R)
    viewed = Expr.of(FloorDiv(_x(), 8)) * 1024 + Expr.of(Mod(_x(), 8)) * 128 + Expr.of(R)
    assert same_address(flat, viewed) and same_address(viewed, flat)


def test_a_near_miss_is_not_the_same():
    flat = _x() * 128 + Expr.of(R)
    off_by_a_row = Expr.of(FloorDiv(_x(), 8)) * 1024 + Expr.of(Mod(_x(), 8)) * 128 + Expr.of(R) + 128
    swapped = Expr.of(FloorDiv(_x(), 8)) * 128 + Expr.of(Mod(_x(), 8)) * 1024 + Expr.of(R)
    assert not same_address(flat, off_by_a_row) and not same_address(flat, swapped)


def test_too_many_points_is_not_claimed():
    big = Var(0, 1 << 20)
    a = Expr.of(FloorDiv(Expr.of(big), 4099)) * 4099 + Expr.of(Mod(Expr.of(big), 4099))
    assert not same_address(Expr.of(big), a, points=1024)  # true, but not shown within the points
    assert same_address(Expr.of(big), a)


def test_a_variable_inside_no_floor_takes_two_points():
    """A language model's head at its real size: rows 4 x 1024, a vocabulary of 32000. The row
    variable repeats every 1024, the column variable is affine: 2048 x 2 points, not 2048 x 2048."""
    rows, cols = Var(0, 4096), Var(1, 32000)
    flat = Expr.of(rows) * 32000 + Expr.of(cols)
    viewed = Expr.of(FloorDiv(Expr.of(rows), 1024)) * 32768000 + Expr.of(Mod(Expr.of(rows), 1024)) * 32000
    assert same_address(flat, viewed + Expr.of(cols), points=4096)
