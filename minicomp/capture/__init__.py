"""Capture: a Python function and its arguments -> an ATen-level torch.fx graph.

tracing.py      trace(): stand-ins first (meta_trace.py), make_fx / AOTAutograd when they cannot follow
outputs.py      Outputs: a record per leaf of the result (a graph output, an argument, a view, a constant)
closed_over.py  ClosedOver: what a trace reads and does besides its inputs (closed-over tensors, writes,
                value reads, grad mode, hooks), refused where a graph cannot keep it
functional.py   writes into temporaries made functional (in-place ops a decomposition leaves)
meta_trace.py   a tracer of ATen ops on meta stand-ins (no torch._dynamo import on a cold start)
specialize.py   Dynamo graphs with symbolic sizes, compiled per concrete size
call_signatures.py  a call's key by its arguments, and the last call's checked first (specialize.py's lookup)
static_parts.py such a graph that is nearly all static (decoding with a KV cache): its static parts compiled once
one_hot.py      a scatter of one value per row as a select (a gather's gradient, traced)
"""

from minicomp.capture.closed_over import ClosedOver
from minicomp.capture.outputs import (
    Argument,
    ArgumentView,
    Constant,
    ConstantView,
    GraphOutput,
    OutputRecord,
    Outputs,
    SameAs,
)
from minicomp.capture.tracing import (
    FUSED_FROM_PARTS,
    Traced,
    call_eagerly,
    decompositions,
    flatten_outputs,
    leaf_names,
    trace,
    training_outputs,
)

__all__ = [
    "FUSED_FROM_PARTS",
    "Argument",
    "ArgumentView",
    "ClosedOver",
    "Constant",
    "ConstantView",
    "GraphOutput",
    "OutputRecord",
    "Outputs",
    "SameAs",
    "Traced",
    "call_eagerly",
    "decompositions",
    "flatten_outputs",
    "leaf_names",
    "trace",
    "training_outputs",
]
