"""Training: forward and backward graphs from AOTAutograd, both compiled by minicomp.

AOTAutograd traces the function and its gradient into an ATen forward graph
and an ATen backward graph, split by the min-cut rematerialization partition:
cheap pointwise values are recomputed in the backward instead of saved, so
the forward saves little (RoPE saves only cos and sin). Views are never saved
(functorch's `recompute_views`): the backward takes them again from their
base, so a slice of an input costs the forward nothing. Each graph then goes
through the same pipeline (pipeline.compile_graph), so the backward is fused
too. Calls where no input needs a gradient never come here (function.py): they
skip the autograd machinery.

AOTAutograd compiles on the first call of a signature, which also runs it
once: that is the one run of the user's call (function.py), never an extra one.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

import torch
from torch.autograd.function import once_differentiable
from torch.utils import _pytree as pytree

from minicomp import capture, config, guards, runtime
from minicomp.dispatch import chunk_tracing, fallback, saved_layouts
from minicomp.dispatch.partition import partition
from minicomp.dispatch.saved_layouts import saved_activations
from minicomp.dispatch.training_call import LeanCall, eager_backward, simple_first_call

if TYPE_CHECKING:
    from minicomp.codegen.families import Families
    from minicomp.pipeline import Compiled


def tangents_like_outputs():
    """AOTAutograd traces the backward for tangents laid out like the outputs they are the gradients
    of, not contiguous: else a transposed output's incoming gradient (RoPE's q as a transposed view
    of a [B, S, H, D] projection) is copied to contiguous before the backward runs, and the backward
    then reads it across its own layout to write the leaf's. The default of newer torch
    (`guess_tangent_strides_as_outputs`); torch 2.11 guesses contiguous."""
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "guess_tangent_strides_as_outputs"):
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(functorch_config.patch(guess_tangent_strides_as_outputs=True))
    stack.enter_context(_overlapping_outputs_take_formats())
    return stack


@contextlib.contextmanager
def _overlapping_outputs_take_formats():
    """An output whose elements share memory (`x.expand(2)`: stride 0) gets a tangent laid out by
    its memory format, not by its strides. Newer torch does so itself; torch 2.11 gave such a
    tangent stride 0, and its backward's `empty_strided(..., (0,)).copy_(grad)` raised "more than
    one element of the written-to tensor refers to a single memory location" (fuzz case 543)."""
    from torch._functorch._aot_autograd import schemas

    meta = getattr(schemas, "MemoryFormatMeta", None)
    if meta is None or _handles_overlap(meta):
        yield
        return
    own = meta.__dict__["from_tensor"]

    def from_tensor(t, *args, **kwargs):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and torch._debug_has_internal_overlap(t) == 1:
            return meta(memory_format=torch._prims_common.suggest_memory_format(t))
        return own.__func__(t, *args, **kwargs)

    meta.from_tensor = staticmethod(from_tensor)
    try:
        yield
    finally:
        meta.from_tensor = own


@functools.cache
def _handles_overlap(meta) -> bool:
    """Whether this torch's MemoryFormatMeta lays out an overlapping output's tangent by format."""
    try:
        return meta.from_tensor(torch.empty(1).expand(2)).memory_format is not None
    except Exception:  # noqa: BLE001 - another signature: leave it as it is
        return True


def input_layouts(forward: torch.fx.GraphModule) -> list[tuple[int, ...] | None]:
    """The strides of each of the forward's inputs, in order: the backward returns their gradients
    in that order, and autograd copies a gradient laid out unlike its leaf (AccumulateGrad's
    layout contract). pipeline.compile_graph writes such a gradient in its leaf's layout instead.
    None for an input with a symbolic stride: a dynamic forward's backward can be static (a size-1
    dimension, whose stride `s7` every call may set otherwise), and its gradient then comes in the
    backward's own layout."""
    layouts = []
    for node in forward.graph.nodes:
        if node.op == "placeholder":
            value = node.meta.get("val")
            fixed = isinstance(value, torch.Tensor) and all(isinstance(n, int) for n in value.stride())
            layouts.append(tuple(value.stride()) if fixed else None)
    return layouts


class TrainingEntry:
    """One signature whose inputs need gradients: an autograd.Function built by AOTAutograd."""

    def __init__(
        self,
        fn,
        leaves,
        in_spec,
        name: str,
        input_names: list[str],
        families: Families | None = None,
        policy: str | None = None,
    ):
        self.tensor_slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        self.forward: Compiled | None = None
        self.backward: Compiled | None = None
        self.outputs: capture.Outputs | None = None
        self.mutated: list[int] | None = None  # known after the first call
        self.simple: tuple[bool, ...] | None = None  # the first call's outputs' requires_grad, if simple
        self.lean: LeanCall | None = None  # once the backward is compiled (training_call.py)
        self.watched: list[torch.Tensor] = []  # tensors it closes over, checked per call (guards.grad_watched)
        self.constants: list[torch.Tensor] = []  # all it closes over: an input it writes into shares none
        self.first: list | None = None  # the first call's leaves while AOTAutograd traces on them
        flat_fn = self._flat(fn, leaves, in_spec)
        self.policy = config.fallback(policy)  # a backward that does not compile runs as traced, by policy
        compile_forward, compile_backward = self._compilers(name, input_names, families)

        self.function = self._aot(flat_fn, compile_forward, compile_backward)
        self.rows_chunked: bool | None = None  # row_regions.py: None until a forward graph says (issue #41)
        self._rechunk = (flat_fn, compile_forward, compile_backward)

    @staticmethod
    def _aot(flat_fn, compile_forward, compile_backward):
        from functorch.compile import aot_function  # AOTAutograd loads all of torch._dynamo

        return aot_function(
            flat_fn,
            fw_compiler=compile_forward,
            bw_compiler=compile_backward,
            partition_fn=partition,
            decompositions=capture.decompositions(),
            keep_inference_input_mutations=True,  # a buffer's update written by the graph (batch norm's stats)
        )

    def _flat(self, fn, leaves, in_spec):
        """fn over its tensor arguments alone, as AOTAutograd traces it; tracing it sets `outputs`
        and `watched`, and refuses what a compiled training graph cannot keep."""
        constants = list(leaves)
        grad_leaves = {i for i in self.tensor_slots if leaves[i].is_leaf and leaves[i].requires_grad}

        def flat_fn(*tensors):
            values = list(constants)
            for slot, t in zip(self.tensor_slots, tensors):
                values[slot] = t
            args, kwargs = pytree.tree_unflatten(values, in_spec)
            seen = capture.ClosedOver()
            with seen.refusing(), seen:
                result = fn(*args, **kwargs)
            for slot, t in zip(self.tensor_slots, tensors):
                if slot in grad_leaves and _data_mutated(t):
                    raise guards.Unguarded(
                        f"it writes in place into argument {slot}, a leaf tensor that requires grad, "
                        "which eager refuses"
                    )
            closed_over = list(seen.tensors.values())
            guards.refuse_grad_constants(closed_over, True)  # a training signature: grad mode is on
            self.watched = guards.grad_watched(closed_over)
            self.constants = closed_over
            written = [slot for slot, t in zip(self.tensor_slots, tensors) if _data_mutated(t)]
            if self.first is not None and guards.shares_memory(self.first, written, [], closed_over):
                raise _WritesIntoAConstant  # (the compiled graph would read it before the write)
            self.outputs, computed = capture.training_outputs(result, seen)
            return computed

        return flat_fn

    def _compilers(self, name: str, input_names: list[str], families: Families | None):
        """AOTAutograd's (fw_compiler, bw_compiler): each graph through minicomp's pipeline."""
        from minicomp.pipeline import compile_graph

        def compile_forward(gm, example_inputs):
            if self.rows_chunked is None and chunk_tracing.has_large_matmul(gm):
                raise chunk_tracing.Chunkable  # traced again with the product computed by chunks (_call)
            any_layout = saved_layouts.any_layout(gm)
            self.forward = compile_graph(
                gm,
                f"{name}_forward",
                input_names,
                families,
                any_layout=any_layout,
                saved=saved_layouts.saved(gm),
                recomputed=saved_layouts.recomputed(gm),
            )
            return self.forward.boxed

        settings = config.current()  # autograd compiles a GPU backward on its own thread

        def compile_backward(gm, example_inputs):
            with config.override(**settings):
                saved = saved_activations(self.forward.fx, gm)
                checks = saved_layouts.laid_out(gm, saved_layouts.produced(self.forward.fx, self.forward))
                try:
                    self.backward = compile_graph(
                        gm,
                        f"{name}_backward",
                        families=families,
                        freed_inputs=saved,
                        output_layouts=input_layouts(self.forward.fx),
                        rounded=self.forward.rounded_values(),  # (computed again here: rounded alike)
                    )
                except Exception as err:  # noqa: BLE001 - the backward runs as traced, by policy
                    from functorch.compile import make_boxed_func

                    fallback.handle(f"{name}_backward", err, self.policy, instead="Running its backward eagerly.")
                    return make_boxed_func(gm.forward)
            return saved_layouts.conformed(self.backward.boxed, checks)

        return compile_forward, compile_backward

    def __call__(self, fn, leaves, in_spec):
        try:
            return self._call(fn, leaves, in_spec)
        except runtime.Reentered:  # called (a signal handler, __del__) while this thread interprets a kernel
            return capture.call_eagerly(fn, leaves, in_spec)

    def _call(self, fn, leaves, in_spec):
        tensors = [leaves[i] for i in self.tensor_slots]
        if self.watched and guards.constants_need_grad(self.watched):
            return capture.call_eagerly(fn, leaves, in_spec)  # a weight it closes over was unfrozen
        if self.lean is not None:
            outputs = self.lean(tensors)
        elif self.mutated is None:  # the first call compiles, on inputs that share no memory
            if guards.any_shared(tensors):
                return capture.call_eagerly(fn, leaves, in_spec)
            before = guards.versions(leaves, self.tensor_slots)
            eager = _eager_outputs(fn, leaves, in_spec, self.tensor_slots)
            self.first = leaves
            with tangents_like_outputs(), _constants_allowed():  # AOTAutograd traces on this first call
                try:
                    outputs = NestedCall.apply(self, eager, *tensors)
                except chunk_tracing.Chunkable:  # a matmul's product over config "chunk_budget_bytes"
                    chunked = chunk_tracing.training_function(self._aot, self._rechunk, tensors)
                    self.function, self.rows_chunked = chunked
                    outputs = NestedCall.apply(self, eager, *tensors)
                except _WritesIntoAConstant:  # nothing compiled: the next call traces again
                    return capture.call_eagerly(fn, leaves, in_spec)
                finally:
                    self.first = None
            after = guards.versions(leaves, self.tensor_slots)
            self.mutated = [slot for slot, a, b in zip(self.tensor_slots, before, after) if a != b]
            if simple_first_call(tensors, outputs, self.mutated):
                self.simple = tuple(o.requires_grad for o in outputs)
        elif self.mutated and guards.shares_memory(leaves, self.mutated, self.tensor_slots, self.constants):
            return capture.call_eagerly(fn, leaves, in_spec)
        elif self.simple is not None and self.backward is not None and config.get("lean_training"):
            eager = None if _draws_random(self.forward.fx) else _eager_outputs(fn, leaves, in_spec, self.tensor_slots)
            self.lean = LeanCall.build(self.forward, self.backward, len(tensors), self.simple, eager)
            self.simple = None  # decided
            outputs = self.lean(tensors) if self.lean is not None else self.function(*tensors)
        elif self.simple is not None and self.backward is None:  # no backward ran yet: maybe a double one
            outputs = NestedCall.apply(self, _eager_outputs(fn, leaves, in_spec, self.tensor_slots), *tensors)
        else:
            outputs = self.function(*tensors)
        return self.outputs.assemble(outputs, leaves)

    @property
    def source(self) -> str:
        parts = [c.source for c in (self.forward, self.backward) if c is not None]
        return "\n\n# ---- backward ----\n\n".join(parts)


class NestedCall(torch.autograd.Function):
    """A training call before its backward is compiled (the first, which AOTAutograd traces and
    compiles on, and those before a first plain backward): AOTAutograd's function run on detached
    aliases of the inputs, inside a function whose backward runs AOTAutograd's (the compiled
    backward) for a plain backward, and eager's for a backward that must itself be differentiable
    (`create_graph=True`), which AOTAutograd's backward is not. Later calls run LeanFunction
    (training_call.py), which does the same, or AOTAutograd's own."""

    @staticmethod
    def forward(ctx, entry: TrainingEntry, eager, *tensors):
        inner = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
        with torch.enable_grad():
            outputs = entry.function(*inner)
        ctx.entry, ctx.eager, ctx.inner, ctx.outputs = entry, eager, inner, outputs
        ctx.save_for_backward(*tensors)  # after the call: the versions it left (a double backward only)
        results = tuple(o.detach() for o in outputs)
        ctx.mark_non_differentiable(*(r for r, o in zip(results, outputs) if not o.requires_grad))
        return results

    @staticmethod
    def backward(ctx, *grads):
        entry = ctx.entry
        # create_graph=True: the compiled backward is not differentiable; eager's is, where recomputing
        # the outputs changes nothing (no input written, no random numbers drawn)
        if torch.is_grad_enabled():
            eager = None if entry.mutated or _draws_random(entry.forward.fx) else ctx.eager
            differentiable = tuple(o.requires_grad for o in ctx.outputs)
            return (None, None, *eager_backward(eager, differentiable, ctx.saved_tensors, grads))
        return _nested_backward(ctx, *grads)


@once_differentiable
def _nested_backward(ctx, *grads):
    """NestedCall's backward: AOTAutograd's, through the graph its forward recorded."""
    outputs, inner = ctx.outputs, ctx.inner
    pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad and g is not None]
    wanted = [i for i, t in enumerate(inner) if t.requires_grad]
    result = [None] * len(inner)
    if pairs and wanted:
        found = torch.autograd.grad(
            [o for o, _ in pairs],
            [inner[i] for i in wanted],
            [g for _, g in pairs],
            allow_unused=True,
            retain_graph=True,  # freed with this node: a retain_graph=True backward may run again
        )
        for i, g in zip(wanted, found):
            result[i] = g
    return (None, None, *result)


def _eager_outputs(fn, leaves, in_spec, tensor_slots):
    """fn over its tensor arguments, run eagerly, returning the tensors of its result in the
    order the forward graph returns them (`capture.training_outputs`): a lean call's double backward."""
    constants = [None if isinstance(v, torch.Tensor) else v for v in leaves]

    def eager(tensors):
        values = list(constants)
        for slot, t in zip(tensor_slots, tensors):
            values[slot] = t
        args, kwargs = pytree.tree_unflatten(values, in_spec if not isinstance(in_spec, int) else _spec(in_spec))
        out_leaves, _ = capture.flatten_outputs(fn(*args, **kwargs))
        return [o for o in out_leaves if isinstance(o, torch.Tensor)]

    return eager


def _draws_random(gm: torch.fx.GraphModule) -> bool:
    """Whether a graph draws random numbers (dropout): an eager recomputation would draw others."""
    return any(
        isinstance(n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags
        for n in gm.graph.nodes
    )


def _spec(count: int):
    return pytree.tree_flatten((tuple(range(count)), {}))[1]


def _data_mutated(t) -> bool:
    """Whether the function wrote into `t`, an input as AOTAutograd traces it (functionalized in its
    first pass: the pass that reads what a graph mutates)."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(t, FunctionalTensor) and torch._functionalize_has_data_mutation(t.elem)


class _WritesIntoAConstant(Exception):  # noqa: N818 - a refusal of this call, not an error
    """The first call writes into an input that shares memory with a tensor the function closes
    over (`f(W)` where f reads the global `W`): the call runs eagerly."""


@contextlib.contextmanager
def _constants_allowed():
    """AOTAutograd traces on fake tensors and refuses a real one, such as a tensor the function
    closes over (a RoPE table, a mask). Allowed while it traces, it becomes a constant of the
    graph, as in `capture.trace`; one that requires grad is refused as the function is traced
    (`flat_fn`: guards.refuse_grad_constants). The switch is fake tensors' thread-local override,
    which the forward's and the backward's traces both read."""
    from torch._subclasses import fake_tensor

    tls = fake_tensor.fake_tensor_tls
    if not hasattr(tls, "allow_non_fake_inputs_override"):  # another torch: real tensors stay refused
        yield
        return
    before = tls.allow_non_fake_inputs_override
    tls.allow_non_fake_inputs_override = True
    try:
        yield
    finally:
        tls.allow_non_fake_inputs_override = before
