"""What a trace to ATen would lose, so that row_regions.py leaves such a graph as captured.

The chunked-loss rewrite (row_regions.py) reads the function as a functionalized ATen graph
(make_fx). That graph keeps no grad-mode switch, no autocast block and no detach (a detach
becomes an alias): a gradient eager stops would flow through it. `stateful` says whether a
Dynamo (or pre-dispatch) graph holds any of these where it matters:

- a block that turns grad mode off matters unless nothing it computes reads a value that
  depends on an input requiring grad (transformers' Llama computes its rotary cos and sin from
  buffers under `torch.no_grad`: no gradient either way);
- a block that turns autocast off matters unless autocast was off already;
- a detach always matters.
"""

from __future__ import annotations

import torch

# ops that grad mode or autocast state would change
_STATEFUL = ("_set_grad_enabled", "_enter_autocast", "_exit_autocast", "set_grad_enabled")
_GRAD_SWITCHES = ("_set_grad_enabled", "set_grad_enabled")
_DETACHES = ("detach", "detach_", "detach.default", "detach_.default")


def stateful(gm: torch.fx.GraphModule, requires_grad: list[bool] | None = None) -> bool:
    """Whether a Dynamo (or pre-dispatch) graph changes grad mode or autocast, or detaches a value:
    the ATen trace would lose that. `requires_grad`: its inputs' flags, by placeholder (None:
    Dynamo's example values)."""
    autocast = any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))
    harmless = _grad_off_reads_no_grad(gm, requires_grad)
    for node in gm.graph.nodes:
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if name in _GRAD_SWITCHES and harmless:
            continue
        if node.op == "call_function" and name in _STATEFUL and not (not autocast and _autocast_off(node)):
            return True
        if node.op in ("call_function", "call_method") and name in _DETACHES:
            return True
    return False


def _grad_off_reads_no_grad(gm: torch.fx.GraphModule, requires_grad: list[bool] | None) -> bool:
    """Whether the graph only turns grad mode off (and back on), and nothing it computes with grad
    off reads a value that depends on an input requiring grad (`requires_grad`, by placeholder;
    None: Dynamo's example values say): what such a block computes has no gradient either way (a
    rotary embedding's cos and sin from buffers under `torch.no_grad`: transformers' Llama)."""
    flags = iter(requires_grad or [])
    enabled, needs = torch.is_grad_enabled(), set()
    for node in gm.graph.nodes:
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if node.op == "placeholder":
            value = node.meta.get("example_value")
            known = value.requires_grad if isinstance(value, torch.Tensor) else value is None  # (unknown: it may)
            flag = next(flags, False) if requires_grad is not None else known
            if flag:
                needs.add(node)
        elif name in _GRAD_SWITCHES:
            wanted = node.args[0] if node.args else None
            if not isinstance(wanted, bool) or (wanted and not torch.is_grad_enabled()):
                return False  # (grad turned on where the call has it off: gradients the trace would lose)
            enabled = wanted
        elif any(read in needs for read in node.all_input_nodes):
            if not enabled and node.op != "output":
                return False
            needs.add(node)
    return enabled == torch.is_grad_enabled()


def _autocast_off(node: torch.fx.Node) -> bool:
    """Whether `node` enters (or exits) an autocast block that turns autocast off: nothing changes
    where it was off already (a rotary embedding computed in float32: transformers' Llama)."""
    if getattr(node.target, "__name__", "") == "_exit_autocast":
        return bool(node.args) and isinstance(node.args[0], torch.fx.Node) and _autocast_off(node.args[0])
    return getattr(node.target, "__name__", "") == "_enter_autocast" and len(node.args) > 2 and node.args[2] is False
