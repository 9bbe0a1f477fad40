"""`torch.compile(model, backend="minicomp")`: minicomp as a TorchDynamo backend.

Dynamo captures each graph between graph breaks; AOTAutograd (as for
`minicomp.jit` with inputs that need gradients) lowers it to ATen forward and
backward graphs with the min-cut partition (saving no views, as for `minicomp.jit`:
partition.py); minicomp compiles each. The package
registers this function under the `torch_dynamo_backends` entry point
(pyproject.toml), so the name "minicomp" works once the package is installed;
without installing, pass the function: `torch.compile(model, backend=minicomp.dispatch.dynamo.backend)`.

A graph with dynamic sizes (Dynamo's automatic dynamic shapes, from a function's
second size on) is compiled once per concrete size (specialize.py), its kernels in the families
of the function's first graph (frame_families.py: the third size compiles no new kernel text);
an inference graph whose work is nearly all of fixed sizes (decoding with a growing KV cache)
has its static parts compiled once for every size instead (static_parts.py). A graph
minicomp cannot compile (an op it cannot trace) runs as Dynamo captured it,
under the fallback policy (fallback.py: a warning by default,
MINICOMP_FALLBACK=raise makes it an error). The forward and backward of one
Dynamo graph share kernel families (codegen/families.py), and are compiled together
(`_backward_with_forward`), so that the Triton compiles of both run side by side.
"""

from __future__ import annotations

import contextlib
import itertools
import threading

import torch

from minicomp import capture, config, gc_pause
from minicomp.capture import closed_over, specialize
from minicomp.codegen.families import Families
from minicomp.dispatch import (
    chunk_tracing,
    donations,
    dynamic_graphs,
    fallback,
    frame_families,
    graphed_calls,
    returned_views,
    saved_layouts,
)
from minicomp.dispatch.autograd import input_layouts, saved_activations, tangents_like_outputs
from minicomp.dispatch.guarded_calls import captured, checked_first_call, eager_when_reentered
from minicomp.dispatch.partition import partition
from minicomp.pipeline import compile_graph, write_graph
from minicomp.runtime import compile_pool

_graph_ids = itertools.count()  # names only: dynamo_graph<n>_forward


def _compiler(role: str, families: Families, settings: dict, forward: dict, graphs=None, inference: bool = False):
    """`forward` carries the forward graph to the backward's compile (its saved activations);
    `graphs` (runtime/graphs.py) records CUDA graphs of what it compiles, when asked for.
    `inference`: a forward no backward follows, whose outputs may come out at the strides its
    plan gives them, as Inductor's do (a padded product's slice: plan/pad_matmuls.py)."""

    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        name = f"dynamo_graph{next(_graph_ids)}_{role}"
        if role == "forward":
            forward["gm"] = gm
        backward = role == "backward" and "gm" in forward
        if backward:
            forward["bw_gm"] = gm  # (a double backward runs both graphs eagerly: _eager_backward)
        saved = saved_activations(forward["gm"], gm) if backward else frozenset()

        def fail(err: Exception) -> None:
            fallback.handle(name, err, config.fallback(), instead="Running it as Dynamo captured it.")

        if specialize.is_dynamic(gm):  # Dynamo made a size dynamic: compiled per size, or by static parts
            dynamic = dynamic_graphs.GraphCompile(
                name, role, gm, families, settings, forward, graphs, inference, saved, fail,
                # (this module's names, looked up at each compile: tests and benchmarks wrap them)
                compile_graph=lambda *args, **kwargs: compile_graph(*args, **kwargs),
                write_graph=lambda *args, **kwargs: write_graph(*args, **kwargs),
            )  # fmt: skip
            return graphed_calls.graphed(graphs, dynamic_graphs.per_size(dynamic), name, role, gm, forward)
        layouts = input_layouts(forward["gm"]) if backward else None
        checks = saved_layouts.laid_out(gm, forward.get("saved_layouts", {})) if backward else []
        any_layout = saved_layouts.any_layout(gm) if role == "forward" else frozenset()
        if inference:
            any_layout |= dynamic_graphs.output_names(gm)
        donated = frozenset()  # saved values the backward may write over (donations.py)
        if backward:
            donated = donations.donated(
                forward["gm"], gm, graphed_calls.saved_count(forward), forward.get("exclusive", frozenset())
            )

        try:
            with config.override(**settings):  # the backward compiles on autograd's thread on a GPU
                compiled = compile_graph(
                    gm,
                    name,
                    families=families,
                    freed_inputs=saved,
                    output_layouts=layouts,
                    any_layout=any_layout,
                    donated=donated,
                    results_over_donated=graphs is None,  # (a replayed forward would write over a gradient)
                    inference=inference,
                    saved=saved_layouts.saved(gm) if role == "forward" else frozenset(),
                    recomputed=saved_layouts.recomputed(gm) if role == "forward" else frozenset(),
                    rounded=forward.get("rounded", frozenset()) if backward else frozenset(),
                )
            if role == "forward":  # the saved values it lays out unlike the traced graph, for its backward
                forward["saved_layouts"] = saved_layouts.produced(gm, compiled)
                forward["rounded"] = compiled.rounded_values()  # (its backward rounds them too)
                forward["exclusive"] = donations.exclusive_outputs(compiled.plan)
            run = eager_when_reentered(checked_first_call(compiled, gm, fail, name), compiled, gm)
            run = donations.kept(saved_layouts.conformed(run, checks), gm, donated)
            if inference:  # (AOTAutograd makes a training forward's aliased outputs itself)
                run = returned_views.returning_views(run, gm, of_inputs=False, of_outputs=True)
            return graphed_calls.graphed(graphs, run, name, role, gm, forward)
        except Exception as err:  # noqa: BLE001 - fall back to the captured graph, by policy
            fail(err)
            return captured(gm)

    return compile_fn


def backend(gm: torch.fx.GraphModule, example_inputs, *, options: dict | None = None, mode: str | None = None):
    """The Dynamo backend: ATen graphs through AOTAutograd, each compiled by minicomp.

    torch.compile passes its `mode` and `options` here: `mode="reduce-overhead"` replays CUDA
    graphs (runtime/graphs.py), as for Inductor; `options` sets any of config's tunables for this
    model (`options={"cuda_graphs": True}`)."""
    families, settings, forward = frame_families.of_traced_function(), config.current() | _options(options, mode), {}
    with gc_pause.paused(settings["pause_gc"]):  # AOTAutograd's traces and both compiles
        return _backend(gm, example_inputs, families, settings, forward)


def _backend(gm: torch.fx.GraphModule, example_inputs, families: Families, settings: dict, forward: dict):
    from torch._dynamo.backends.common import aot_autograd

    graphs = graphed_calls.graphs(settings, example_inputs)
    gm = closed_over.with_checked_forms(gm)
    with config.override(**settings):  # (options may set "chunk_budget_bytes")
        gm = chunk_tracing.dynamo_graph(gm, example_inputs)  # a matmul's product only row reductions read: by chunks
    compile_pool.start_triton(example_inputs)  # Triton's one-time costs run while AOTAutograd traces
    compile_both = aot_autograd(
        fw_compiler=_compiler("forward", families, settings, forward, graphs),
        bw_compiler=_compiler("backward", families, settings, forward, graphs),
        inference_compiler=_compiler("forward", families, settings, forward, graphs, inference=True),
        partition_fn=partition,  # saves no views: they were copied out of the forward by a kernel each
        decompositions=capture.decompositions(),
        keep_inference_input_mutations=True,  # a buffer's update (batch norm's running stats) in the graph
    )
    with _backward_with_forward(), tangents_like_outputs(), _autograd_functions() as built:
        compiled = compile_both(gm, example_inputs)
    for function in built:
        _differentiable_backward(function, forward)
        if getattr(getattr(function, "metadata", None), "bw_donated_idxs", []) is None:
            function.metadata.bw_donated_idxs = []  # none donated (_backward_with_forward): retain_graph works
    return compiled


MODES = {"default": {}, "reduce-overhead": {"cuda_graphs": True}}  # torch.compile's `mode` for this backend


def _options(options: dict | None, mode: str | None) -> dict:
    """The tunables torch.compile's `mode` and `options` set (config.ConfigError for others)."""
    if mode is not None and mode not in MODES:
        raise config.ConfigError(f"backend 'minicomp' has the modes {', '.join(MODES)}, not {mode!r}")
    settings = dict(MODES[mode or "default"])
    for name, value in (options or {}).items():
        if name not in config.DEFAULTS:
            raise config.ConfigError(
                f"backend 'minicomp' has no option {name!r}; its options are config's tunables: "
                + ", ".join(config.DEFAULTS)
            )
        settings[name] = config.checked(name, value)
    return settings


@contextlib.contextmanager
def _autograd_functions():
    """The autograd.Function classes AOTAutograd builds meanwhile on this thread (one for a graph
    that needs gradients): through its factory (newer torch), else as classes named
    CompiledFunction are made (torch 2.11 defines the class inside its compile)."""
    from torch._functorch._aot_autograd import runtime_wrappers

    factory = getattr(runtime_wrappers, "_AOTDispatchAutogradFunctionFactory", None)
    built: list = []
    if factory is None or not hasattr(factory, "build"):
        with _classes_made("CompiledFunction", built):
            yield built
        return
    build, thread = factory.build, threading.get_ident()

    def recording(self):
        function = build(self)
        if threading.get_ident() == thread:  # (not another thread's compile meanwhile)
            built.append(function)
        return function

    factory.build = recording
    try:
        yield built
    finally:
        factory.build = build


@contextlib.contextmanager
def _classes_made(name: str, built: list):
    """autograd.Function subclasses called `name` made meanwhile on this thread, into `built`."""
    meta, thread = torch.autograd.function.FunctionMeta, threading.get_ident()
    own = meta.__init__

    def recording(cls, *args, **kwargs):
        own(cls, *args, **kwargs)
        if cls.__name__ == name and threading.get_ident() == thread:
            built.append(cls)

    meta.__init__ = recording
    try:
        yield built
    finally:
        meta.__init__ = own


def _differentiable_backward(function, forward: dict) -> None:
    """A double backward (`torch.autograd.grad(..., create_graph=True)`, then a gradient of that
    gradient) through AOTAutograd's `function`, right: AOTAutograd's compiled backward is not
    differentiable (it raised its internal error, or its gradients hung off a dummy input and
    the second gradient came back None). A backward with grad mode on runs the ATen forward and
    backward graphs eagerly instead, from the call's inputs, so that autograd records them; a
    plain backward stays the compiled one. Each call keeps its inputs (a reference on its
    autograd node, dropped by a backward that frees the graph: about 0.1 us a call)."""
    if not all(hasattr(function, name) for name in ("_backward_impl", "_double_backward")):
        return
    if hasattr(function, "_fwd_fn") and hasattr(function, "_bw_epilogue_fn"):
        run_forward, epilogue = function._fwd_fn, function._bw_epilogue_fn

        def keeping_inputs(ctx, args, *rest):
            ctx._minicomp_inputs = args
            return run_forward(ctx, args, *rest)

        function._fwd_fn = keeping_inputs
    else:  # torch 2.11: the class's own forward, the module's epilogue
        from torch._functorch._aot_autograd import runtime_wrappers

        run_forward, finish = function.forward, runtime_wrappers._backward_epilogue_functional

        def keeping_all(ctx, *args):
            ctx._minicomp_inputs = args
            return run_forward(ctx, *args)

        def epilogue(out):
            return finish(function.metadata, function.maybe_subclass_metadata, out)

        run_own_backward = function.backward

        def backward(ctx, *grads):
            # 2.11 takes its double-backward path only where a saved value or a gradient needs a
            # gradient (softmax saves its output alone): a gradient as a leaf that does sends it there
            inputs = getattr(ctx, "_minicomp_inputs", None) or ()
            if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
                at = next((i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)), None)
                if at is not None and not any(isinstance(g, torch.Tensor) and g.requires_grad for g in grads):
                    grads = (*grads[:at], grads[at].detach().requires_grad_(), *grads[at + 1 :])
            return run_own_backward(ctx, *grads)

        function.forward = staticmethod(keeping_all)
        function.backward = staticmethod(backward)
        if getattr(function.metadata, "bw_donated_idxs", None):
            function.metadata.bw_donated_idxs = []  # none donated: retain_graph=True works
    run_backward = function._backward_impl

    def releasing_inputs(ctx, all_args):
        if not torch._C._autograd._get_current_graph_task_keep_graph():
            ctx._minicomp_inputs = None
        return run_backward(ctx, all_args)

    def double_backward(ctx, impl_fn, all_args):
        graphs = forward
        if graphs.get("bw_gm") is None:  # torch 2.11 compiles the backward at its first call: its graph
            lazy = getattr(function, "_lazy_backward_info", None)
            graphs = {**forward, "bw_gm": getattr(lazy, "bw_module", None)}
        return epilogue(_eager_backward(ctx, all_args, graphs))

    function._backward_impl = staticmethod(releasing_inputs)
    function._double_backward = staticmethod(double_backward)


def _eager_backward(ctx, all_args: list, forward: dict) -> list:
    """The gradients of one call (`all_args`: the backward graph's inputs, saved values then
    tangents), computed by the ATen graphs run eagerly with grad mode on: the forward graph
    from the call's inputs (what the backward reads of it then depends on them), then the
    backward graph. A graph drawing random numbers raises a one-line reason."""
    fw_gm, bw_gm = forward.get("gm"), forward.get("bw_gm")
    inputs = getattr(ctx, "_minicomp_inputs", None)
    fw_inputs = [n.name for n in fw_gm.graph.nodes if n.op == "placeholder"] if fw_gm is not None else []
    why = None
    if bw_gm is None or inputs is None or len(inputs) != len(fw_inputs):
        why = "its graphs or the call's inputs are not at hand"
    elif any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()) for n in fw_gm.graph.nodes):
        why = "it draws random numbers, which running it again would draw anew"
    elif any(n.target is torch.ops.minicomp.chunked_rows_early.default for n in fw_gm.graph.nodes):
        why = (
            'its chunked loss (config "chunk_budget_bytes") makes its gradients in the forward, '
            "which are not differentiable"
        )
    if why is not None:
        raise RuntimeError(f"minicomp cannot differentiate the compiled backward (create_graph=True) here: {why}")
    with torch.enable_grad():
        computed = fw_gm(*inputs)
    outputs = next(n for n in fw_gm.graph.nodes if n.op == "output").args[0]
    values = dict(zip(fw_inputs, inputs))
    values.update((n.name, v) for n, v in zip(outputs, computed) if isinstance(n, torch.fx.Node))
    names = [n.name for n in bw_gm.graph.nodes if n.op == "placeholder"]
    args = [values.get(name, arg) if not name.startswith("tangents") else arg for name, arg in zip(names, all_args)]
    with torch.enable_grad():
        return list(bw_gm(*args))


def _backward_with_forward():
    """AOTAutograd compiles the backward when the forward is compiled, not at the first backward:
    its kernels then compile (in threads, launch.py `prepare`) while the forward runs, instead of
    after it. (A torch without the setting compiles it at the first backward.) And no donated
    buffers: minicomp reuses none of them, and AOTAutograd refused a backward with
    `retain_graph=True` (or `create_graph=True`) for a graph that has some."""
    import torch._functorch.config as functorch_config

    settings = {
        name: value
        for name, value in (("force_non_lazy_backward_lowering", True), ("donated_buffer", False))
        if hasattr(functorch_config, name)
    }
    return functorch_config.patch(**settings) if settings else contextlib.nullcontext()


def registered() -> str:
    """ "minicomp", the name users pass to torch.compile: registered by the installed package's
    entry point, or here for a source tree on PYTHONPATH (no entry point)."""
    from torch._dynamo.backends.registry import list_backends, register_backend

    if "minicomp" not in list_backends(exclude_tags=()):
        register_backend(name="minicomp")(backend)
    return "minicomp"
