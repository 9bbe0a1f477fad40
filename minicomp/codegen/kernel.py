"""What every kernel writer shares: evaluating the plan's nodes at an index.

The writer evaluates each stored node at the kernel's root index and recurses
through the lowering table (ops/): a pointwise op becomes one line named after
its FX node, a view only rewrites the index it passes down, and a node the plan
lists among the kernel's loads becomes a masked `tl.load`. Evaluations are
memoized on (node, index, mask), so a value used twice at the same index is
computed once, and one used at a shifted index (rotate_half) is loaded again at
that index.

A kernel kind (codegen/pointwise.py) subclasses `KernelWriter`: it says what
its tile is (`tile`, the shape of every value: `[BLOCK_SIZE]`), how its
iteration variables are defined, and where it stores; the lowering rules only
see an index and the tile, so they serve every kind. It writes a subclass of
`KernelSource`: its own launch fields, its template and its launch spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from minicomp.codegen.parts import boundary, period
from minicomp.ir import dtypes
from minicomp.lowering import ops
from minicomp.lowering.indexing import SIZE, Dyn, Expr, IterationSpace, Mod, Var, const, decide, render_flat, size
from minicomp.plan.fusion import Kernel, Plan
from minicomp.runtime.launch_spec import LaunchSpec


@dataclass(kw_only=True)
class KernelSource:
    """One kernel's text, what its launch passes and how to launch it; `body` holds marked sizes
    until codegen/families.py writes them out (as literals or runtime sizes). A kernel kind
    subclasses it with its own launch fields, its template and its launch spec."""

    kind: ClassVar[str]  # the kernel kind, as KernelCall reports it
    template: ClassVar[str]  # its template in templates/
    renamable: ClassVar[bool] = True  # its text may serve a family member that names its locals otherwise
    numel_param: ClassVar[str | None] = None  # the template's parameter for `numel` (families.py may unspecialize it)

    kernel: Kernel
    name: str
    params: list[str]  # pointer parameter names, in launch order
    args: list[str]  # the buffers passed for them, in the same order
    numel: int  # the launch's first integer argument: elements (n_elements) or rows (n_rows)
    header: list[str]
    body: list[str]
    wide_index: bool  # offsets need int64
    sizes: list[str] = field(default_factory=list)  # runtime size parameters (codegen/families.py)
    size_values: list[int] = field(default_factory=list)  # and this signature's values for them
    unspecialized: list[str] = field(default_factory=list)  # sizes Triton must not specialize on (families.py)

    def launch_spec(self) -> LaunchSpec:
        """The launch spec its module's `Launch` gets (runtime/launch_spec.py)."""
        raise NotImplementedError


class KernelWriter:
    """Evaluates the plan's nodes at indexes over `space`, collecting the kernel's lines.

    A kind sets `space` (its iteration variables), `tile` (the shape of every
    value, as Triton source), `root_mask` (the name of the bounds mask) and
    `reserved` (the names its template defines, which no value may take)."""

    tile: str
    root_mask: str
    reserved: tuple[str, ...]

    def __init__(self, plan: Plan, kernel: Kernel, space: IterationSpace, survey: dict | None = None):
        self.plan, self.graph, self.kernel = plan, plan.graph, kernel
        self.space = space
        self.loads = set(kernel.loads)  # what the plan says this kernel reads from memory
        self.boundaries: dict[int, set[int]] = {}  # space dim -> where a comparison changes truth
        self.periods: dict[int, set[int]] = {}  # space dim -> P of a comparison of (c*x + k) % m
        self.plain_loads: list[str] = []  # loads under no condition but the bounds mask: emitted first
        self.lines: list[str] = []  # everything else, in evaluation order
        self.memo: dict[tuple, ops.Value] = {}  # (node, index, mask) -> its value
        self.emitted: dict[tuple, ops.Value] = {}  # (code, dtype) -> the line that computes it
        self.taken: set[str] = set(self.reserved)  # (and every node's name: `graph.nodes`)
        self.used: set[str] = set()
        self.pointers: dict[str, str] = {}  # buffer name -> pointer parameter
        self.load_offsets: dict[str, set[Expr | None]] = {}  # buffer -> element offsets loaded (None: a broadcast)
        # (buffer, offset) -> the conditions it is loaded under; a writer given an earlier pass's
        # (`survey`) loads an address once where two of them are complementary (`merged_mask`)
        self.requests: dict[tuple[str, Expr], set[tuple[str, ...]]] = {}
        self.survey = survey
        self.vars: set[Var] = set()
        self.fill = "0"  # what the masked-off lanes of a load hold (a reduction may ask for its identity) ...
        self.filled: dict[str, str] = {}  # ... and the loads written with another fill than 0: name -> fill

    # -- names --------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """`hint` itself the first time a node is computed, `hint_1`, ... after."""
        name, n = hint, 0
        while name in self.used or ((name in self.taken or name in self.graph.nodes) and name != hint):
            n += 1
            name = f"{hint}_{n}"
        self.used.add(name)
        return name

    def atom_name(self, atom) -> str:
        if isinstance(atom, Var):
            self.vars.add(atom)
            return f"x{atom.dim}"
        if isinstance(atom, Dyn):
            return atom.code
        return render_flat(atom)

    def tile_for(self, index: tuple[Expr, ...]) -> str:
        """The shape of a value evaluated at `index` (one tile for every value of a pointwise kernel)."""
        return self.tile

    def is_full(self, index: tuple[Expr, ...]) -> bool:
        """Whether a value at `index` spans the whole tile (a reduction kernel's row values do not)."""
        return True

    def load_mask(self, index: tuple[Expr, ...], mask: tuple[str, ...]) -> str:
        return self.mask_text(mask)

    def index_text(self, expr: Expr) -> str:
        return expr.render(self.atom_name)

    def address(self, expr: Expr, apart: frozenset[int] = frozenset()) -> str:
        return self.space.collapse(expr, apart).render(self.atom_name)

    def mask_text(self, mask: tuple[str, ...]) -> str:
        return " & ".join((self.root_mask,) + mask)

    def compare(self, expr: Expr, relation: str, bound: int) -> str | bool:
        """`expr <relation> bound` (>=, < or ==): decided here when the range of `expr` lies on
        one side, else its source. Where the truth changes at one value of a variable whatever
        the rest of `expr` is (`3*x0 + x1 >= 3` with x1 < 3: at x0 = 1), that value is recorded
        as a boundary of the variable's range (codegen/parts.py)."""
        decided = decide(expr, relation, bound)
        if decided is not None:
            return decided
        for atom, coeff in expr.terms:
            if isinstance(atom, Var):
                rest_lo, rest_hi = (expr - Expr.of(atom) * coeff).bounds
                cut = boundary(coeff, rest_lo, relation, bound)
                if cut == boundary(coeff, rest_hi, relation, bound):
                    self.boundaries.setdefault(atom.dim, set()).update(cut)
            elif isinstance(atom, Mod):
                self._note_period(atom.expr, atom.divisor)
        return f"({self.index_text(expr)} {relation} {self.index_text(const(bound))})"

    def divides(self, expr: Expr, step: int) -> str | bool:
        """`expr % step == 0` (a strided slice's elements): decided here when the remainder is a
        constant of the index, else its source, recording its period (codegen/parts.py)."""
        rest = expr.mod(step)
        if rest.is_const:
            return rest.const == 0
        self._note_period(expr, step)
        return f"(({self.index_text(expr)}) % {size(step)} == 0)"

    def _note_period(self, expr: Expr, modulus: int) -> None:
        found = period(expr, modulus)
        if found is not None:
            self.periods.setdefault(found[0], set()).add(found[1])

    # -- values -------------------------------------------------------------
    def temp(self, code: str, dtype: torch.dtype, hint: str, comment: str = "", plain_load: bool = False) -> ops.Value:
        """A line `name = code`; the same code again (same dtype) reuses the first line's name.
        Every line is pure (stores come last), so this is common-subexpression elimination: two
        slices of one gradient test `x3 < 64` once, and a load behind that test is shared too."""
        key = (code, dtype)
        if key not in self.emitted:
            name = self.fresh(hint)
            line = f"{name} = {code}" + (f"  # {comment}" if comment else "")
            (self.plain_loads if plain_load else self.lines).append(line)
            self.emitted[key] = ops.Value(name, dtype)
        return self.emitted[key]

    def value(self, name: str, index: tuple[Expr, ...], mask: tuple[str, ...] = ()) -> ops.Value:
        key = (name, index, mask)
        if key not in self.memo:
            self.memo[key] = self._evaluate(name, index, mask)
        return self.memo[key]

    def _evaluate(self, name: str, index, mask) -> ops.Value:
        node = self.graph[name]
        if name in self.loads:
            return self.load(name, index, mask)
        op_name = node.op_name
        op = ops.Op(node, self.graph, self, index, mask)
        if op_name in ops.VIEWS:
            source, source_index = ops.VIEWS[op_name](op, index)
            value = self.value(source, source_index, mask)
            if node.meta.dtype != (was := self.graph[source].meta.dtype):  # view(dtype): the same bits
                code = ops.bitcast(value, was, node.meta.dtype)
                value = self.temp(code, dtypes.compute_dtype(node.meta.dtype), name, _provenance(node))
            return self.as_stored(name, value)
        rule = ops.INDEXED.get(op_name) or ops.POINTWISE[op_name]
        code = rule(op)
        if code in self.used:  # the rule passed a value through (a decided cat or scatter): no alias line
            return self.as_stored(name, ops.Value(code, op.compute))
        return self.as_stored(name, self.temp(code, op.compute, name, _provenance(node)))

    def as_stored(self, name: str, value: ops.Value) -> ops.Value:
        """A 16-bit value the plan writes to save later kernels' reads (`Plan.rounded`), rounded to
        its dtype wherever it is computed: every kernel uses the value a kernel loading it reads."""
        if name not in self.plan.rounded or value.dtype != torch.float32:
            return value
        dtype = self.graph[name].meta.dtype
        code = f"{value.code}.to({dtypes.triton_dtype(dtype)}).to(tl.float32)"
        return self.temp(code, torch.float32, name, "rounded as stored")

    def offset_of(self, name: str, index) -> Expr:
        """The element offset of `index` into buffer `name`, at the strides the plan allocates it
        with (a value written inside a padded buffer, plan/padded_writes.py), else its traced ones."""
        meta = self.graph[name].meta
        offset = Expr()
        for e, stride, extent in zip(index, self.plan.strides.get(name, meta.stride), meta.shape):
            if extent > 1:
                offset = offset + e * stride
        return offset

    def load(self, name: str, index, mask) -> ops.Value:
        meta = self.graph[name].meta
        if name not in self.pointers:
            self.pointers[name] = f"{name}_ptr"
        offset = self.offset_of(name, index)
        self.load_offsets.setdefault(name, set()).add(None if offset.is_const else offset)
        self.requests.setdefault((name, offset), set()).add(mask)
        mask = self.merged_mask(name, offset, mask)
        if offset.is_const:  # one element for every lane (0-d or fully broadcast): load once, spread
            code = f"tl.broadcast_to(tl.load({self.pointers[name]} + {size(offset.const)}), {self.tile_for(index)})"
        else:
            address = paren(self.address(offset))
            hint = self.eviction(name, offset, index)
            policy = f", eviction_policy='{hint}'" if hint else ""
            mask_text = self.load_mask(index, mask)
            code = f"tl.load({self.pointers[name]} + {address}, mask={mask_text}, other={self.fill}{policy})"
        dtype = meta.dtype
        if dtype in dtypes.LOW_PRECISION:
            code += ".to(tl.float32)"
            dtype = torch.float32
        # A load behind no condition but the bounds mask depends on nothing but the index: it goes to
        # the top, so each row's own elements are requested before the shifted, conditional reads of
        # the same rows (RoPE's rotate_half, slice gradients; benchmarks/experiments/rope_backward_variants.py).
        value = self.temp(code, dtype, name, plain_load=not mask)
        if self.fill != "0" and not offset.is_const:
            self.filled[value.code] = self.fill
        return value

    def eviction(self, name: str, offset: Expr, index) -> str | None:
        """The L2 eviction policy of a load (a looped reduction's, codegen/reduction.py); else None."""
        return None

    def merged_mask(self, name: str, offset: Expr, mask: tuple[str, ...]) -> tuple[str, ...]:
        """`mask` without a condition whose complement the same address is also loaded under (with
        the same other conditions), by the survey of an earlier pass over this kernel: GPT-NeoX's
        partial rotary reads each element of q twice, once as the rotated part (`x3 < 32`) and once
        as the part passed through (`x3 >= 32`); it becomes one load under neither. Each load was
        in bounds under its own condition, so one under their union is too, and it reads no
        element neither would."""
        if not self.survey or not mask:
            return mask
        others = self.survey.get((name, offset), set())
        for k, condition in enumerate(mask):
            rest = mask[:k] + mask[k + 1 :]
            complement = _complement(condition)
            if complement and any(
                complement in other and sorted(c for c in other if c != complement) == sorted(rest) for other in others
            ):
                return self.merged_mask(name, offset, rest)
        return mask


COMPARISON = re.compile(r"^\((.*) (>=|<) (\S+)\)$")  # the bound may be a marked size: «32»


def _complement(condition: str) -> str | None:
    """`(e < b)` for `(e >= b)` and back, as KernelWriter.compare writes them; else None."""
    match = COMPARISON.match(condition)
    if not match:
        return None
    expr, relation, bound = match.groups()
    return f"({expr} {'<' if relation == '>=' else '>='} {bound})"


INT32_LIMIT = 2**31 - 1


def out_pointers(stores: list[str]) -> dict[str, str]:
    """Stored value -> its pointer parameter: `out_ptr` for a kernel's one output, else `out{k}_ptr`."""
    return {name: "out_ptr" if len(stores) == 1 else f"out{k}_ptr" for k, name in enumerate(stores)}


def needs_wide_index(plan, numel: int, buffers) -> bool:
    """Whether offsets need int64: the space, or an element offset of some buffer (at its plan
    strides), passes int32."""
    worst = 0
    for name in buffers:
        meta = plan.graph[name].meta
        strides = plan.strides.get(name, meta.stride)
        worst = max(worst, sum((s - 1) * st for s, st in zip(meta.shape, strides) if s > 0))
    return numel > INT32_LIMIT or worst > INT32_LIMIT


def paren(text: str) -> str:
    """`text` parenthesized unless it is one name or number (marked sizes count as numbers)."""
    return text if text.isidentifier() or text.isdigit() or SIZE.fullmatch(text) else f"({text})"


def _provenance(node) -> str:
    return f"aten.{node.target._opname}.{node.target._overloadname}"
