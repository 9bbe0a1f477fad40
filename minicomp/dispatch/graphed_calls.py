"""A Dynamo graph's compiled forward and backward replaying CUDA graphs (runtime/graphs.py), when
torch.compile's mode or options ask for them: which inputs each graph holds at their own address,
and what its outputs are to their callers."""

from __future__ import annotations

import torch


def graphs(settings: dict, example_inputs):
    """The CUDA graphs of this Dynamo graph's forward and backward (runtime/graphs.py), where
    `settings` ask for them and an input is on a GPU; else None."""
    if not settings["cuda_graphs"] or not any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs):
        return None
    from minicomp.runtime.graphs import Graphs

    return Graphs(settings["cuda_graph_limit"], settings["cuda_graph_rerecords"])


def graphed(graphs, run, name: str, role: str, gm: torch.fx.GraphModule, forward: dict):
    """`run` replaying CUDA graphs (runtime/graphs.py) when `graphs` is given. A forward's static
    inputs are the parameters and buffers (AOTAutograd's `static_input_indices`) and any input it
    writes into (an input mutation AOTAutograd keeps in the graph), and its outputs
    past those a backward reads are handed to it uncopied; a backward's static inputs are all but
    its tangents (saved activations, parameters), and its outputs (gradients) are kept by callers
    as a rule (graph_outputs.py)."""
    if graphs is None:
        return run
    if role == "backward":
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        static = [i for i, n in enumerate(placeholders) if not n.name.startswith("tangents")]
        replayed = graphs.wrap(run, name, static=static, kept=True)  # gradients: autograd accumulates into them
        return _unreplayed_when_kept(replayed, run)
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    fixed = set(getattr(metadata, "static_input_indices", None) or ())
    for i, info in enumerate(getattr(metadata, "input_info", None) or ()):  # an input the graph writes into
        if getattr(getattr(info, "mutation_type", None), "name", None) == "MUTATED_IN_GRAPH":
            fixed.add(i)

    def static(i: int, t: torch.Tensor) -> bool:  # (a parameter: also where AOTAutograd did not say)
        return i in fixed or isinstance(t, torch.nn.Parameter)

    return graphs.wrap(run, name, static=static, saved=lambda: saved_count(forward))


def saved_count(forward: dict) -> int:
    """How many of the forward's last outputs its backward reads (0 while no backward is compiled)."""
    backward = forward.get("bw_gm")
    if backward is None:
        return 0
    return sum(1 for n in backward.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents"))


def _unreplayed_when_kept(replayed, run):
    """A backward that runs `run` itself, not its replay, when autograd keeps the graph for another
    backward (`retain_graph=True`): a replay repeats what its capture did, so a backward captured
    without that flag writes over the saved values it donated (donations.py; `run` copies them
    under it), which the next backward reads."""

    def call(args):
        if torch._C._autograd._get_current_graph_task_keep_graph():
            return run(args)
        return replayed(args)

    call._boxed_call = True  # AOTAutograd's mark: it passes its argument list
    return call
