"""A Dynamo graph whose sizes are symbols (automatic dynamic shapes), compiled for each size.

Each concrete size of the graph is compiled as a static graph of its own (capture/specialize.py),
or, for an inference graph nearly all of fixed sizes (decoding with a growing KV cache), its
static parts once for every size (capture/static_parts.py). Each size keeps what the static path
(dynamo.py) agrees between a forward and its backward (sized_contracts.py): an inference's outputs
at its plan's strides, a training forward's saved values only its backward reads left strided,
the backward's donations and its gradients in their leaves' layouts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from minicomp import config, logs
from minicomp.capture import specialize, static_parts
from minicomp.codegen.families import Families
from minicomp.dispatch import donations, graphed_calls, returned_views, saved_layouts, sized_contracts
from minicomp.dispatch.autograd import input_layouts
from minicomp.dispatch.guarded_calls import captured, checked_first_call, eager_when_reentered


@dataclasses.dataclass(frozen=True)
class GraphCompile:
    """One Dynamo graph's compile, as dynamo.py's compiler knows it."""

    name: str
    role: str  # "forward" or "backward"
    gm: torch.fx.GraphModule  # the graph, its sizes symbols
    families: Families
    settings: dict  # config's tunables for this model
    forward: dict  # the forward's graph and what its compiles tell the backward's
    graphs: object  # runtime/graphs.py's Graphs where CUDA graphs are recorded, else None
    inference: bool
    saved: frozenset[str]  # a backward's inputs the forward computed
    fail: Callable[[Exception], None]  # the fallback policy
    compile_graph: Callable  # pipeline.compile_graph, as the caller reaches it
    write_graph: Callable  # pipeline.write_graph, likewise


def output_names(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The names of the values `gm` returns."""
    outputs = next(reversed(gm.graph.find_nodes(op="output"))).args[0]
    return frozenset(n.name for n in outputs if isinstance(n, torch.fx.Node))


def per_size(c: GraphCompile):
    """A boxed callable running `c.gm` through the static graph compiled for each call's sizes."""
    name, role, gm, families, settings, forward = c.name, c.role, c.gm, c.families, c.settings, c.forward
    graphs, inference, saved, fail = c.graphs, c.inference, c.saved, c.fail
    backward = role == "backward" and "gm" in forward
    contracts = forward.setdefault("contracts", sized_contracts.Contracts())  # a size's forward to its backward
    fw_saved = sized_contracts.saved_tensors(forward["gm"], saved_layouts.saved(forward["gm"]))
    strided = saved_layouts.any_layout(gm) if role == "forward" and not inference else frozenset()

    def static_options(static: torch.fx.GraphModule, whole: bool = True) -> dict:
        # the values by name of `gm` (a retraced size names its nodes anew: none); `whole`:
        # the graph of a size, not a static part (whose outputs later parts and ATen read
        # at the strides the trace predicted)
        renamed = static.meta.get(specialize.RETRACED, False)
        if not whole:
            any_layout = frozenset()
        else:  # an inference's outputs; a training forward's values only its backward reads, by name
            any_layout = output_names(static) if inference else frozenset() if renamed else strided
        return dict(
            families=families,
            any_layout=any_layout,
            freed_inputs=saved,
            inference=inference,
            saved=saved_layouts.saved(gm) if role == "forward" else frozenset(),
            recomputed=saved_layouts.recomputed(gm) if role == "forward" and not renamed else frozenset(),
            rounded=forward.get("rounded", frozenset()) if backward and not renamed else frozenset(),
        )

    def write_static(static: torch.fx.GraphModule, input_names: list[str]):
        # (no matmul timed at a probe's shapes: a record's answer or the untimed default)
        with config.override(**{**settings, "measure_matmuls": False}):
            c.write_graph(static, f"{name}_probe", input_names, probe=True, **static_options(static))

    def compile_static(static: torch.fx.GraphModule, input_names: list[str], part: str = name):
        renamed = static.meta.get(specialize.RETRACED, False)
        options = static_options(static, part == name)
        checks, produced = [], None
        if backward:  # what this size's forward produced: its saved values' layouts, its donations
            options["output_layouts"] = input_layouts(forward["gm"])  # (a gradient in its leaf's layout)
            key, produced = (None, None) if renamed else contracts.for_backward(static, fw_saved)
            checks = sized_contracts.backward_checks(
                static, input_names, produced, saved_layouts.any_layout(forward["gm"])
            )
            if produced is not None:
                options["donated"] = donations.donated(
                    forward["gm"], gm, graphed_calls.saved_count(forward), produced.exclusive
                )
                options["results_over_donated"] = graphs is None
        with config.override(**settings):
            compiled = c.compile_graph(static, part, input_names, **options)
        if role == "forward":  # (the values its backward reads, for a fallback's copies)
            static.meta.setdefault(saved_layouts.SAVED, saved_layouts.saved(gm))
            if not renamed:
                forward["rounded"] = forward.get("rounded", frozenset()) | compiled.rounded_values()
            if not inference and not renamed and part == name:  # (what this size's backward may rely on)
                static.meta[saved_layouts.ANY_LAYOUT] = strided
                made = sized_contracts.Produced(
                    saved_layouts.produced(static, compiled), donations.exclusive_outputs(compiled.plan)
                )
                contracts.forward_compiled(static, fw_saved, made)
        boxed = checked_first_call(compiled, static, fail, part)  # (a first call that fails: as captured)
        if role == "forward":  # (a size of a dynamic graph: its views of inputs too)
            boxed = returned_views.returning_views(boxed, static, of_inputs=True, of_outputs=inference)
        boxed = eager_when_reentered(boxed, compiled, static)
        if produced is not None:  # (another forward of these shapes may yet produce otherwise)
            boxed = contracts.relied_on(boxed, key, captured(static))
        donated = options.get("donated", frozenset())
        return donations.kept(saved_layouts.conformed(boxed, checks), static, donated)

    run = None
    if inference and graphs is None:  # (a CUDA graph per size records each size anyway)
        with config.override(**settings):
            run = _cut(gm, compile_static, fail, name)  # its static parts once, for every size
    if run is None:  # one static graph per size
        with config.override(**settings):
            probing = config.get("probe_sizes")
        restrided = saved_layouts.any_layout(forward["gm"]) if backward else frozenset()  # (its forward's)
        run = specialize.Specializing(gm, compile_static, fail, write_static if probing else None, restrided)
    return run


def _cut(gm: torch.fx.GraphModule, compile_static, fail, name: str):
    """A dynamic inference graph cut into static parts (static_parts.py), or None where it is not
    worth it or cannot be cut (then it is compiled per size)."""
    try:
        fixed = static_parts.static_nodes(gm)
        if not static_parts.worth_cutting(gm, fixed):
            return None
        return static_parts.StaticParts(gm, fixed, compile_static, fail, name)
    except Exception as err:  # noqa: BLE001 - compiled per size instead
        logs.recompiles.info("%s: not cut into static parts (%s: %s)", name, type(err).__name__, err)
        return None
