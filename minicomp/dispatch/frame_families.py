"""The kernel families of a function Dynamo compiles, shared by all its graphs and recompiles.

Dynamo compiles a function's first call as a static graph, and its second size (automatic dynamic
shapes) as a new, dynamic graph: two calls of the backend. With a `Families` per call, the second
length's kernels were each the first member of a new family (their sizes literals, new Triton
text), and the third length's widened them into templates with runtime sizes: new text again, so
a compile at every kernel (issue #42: GPT-2, 7 binaries, 1.3-1.9 s, at the third length). Shared
per function, the second length already joins the first length's families: its kernels are the
templates, and the third length reuses them.

The function is the code object Dynamo is tracing (its InstructionTranslator's `f_code`): what
one function saw never changes another's code, as for `minicomp.jit` (codegen/families.py). A
function's first compile (Dynamo's `frame_compile_id` 0: also its first after
`torch._dynamo.reset()`) starts new families; its graphs in that compile (graph breaks) and its
recompiles share them. The last `LIMIT` functions' families are kept; outside a Dynamo trace (a
direct call of the backend) each call gets its own.
"""

from __future__ import annotations

import collections
import threading
import weakref

from minicomp.codegen.families import Families

LIMIT = 256  # functions whose families are kept (the least recently compiled goes first)

# id(code object) -> (the code object, held so that its id stays its own; its Families; a weak
# reference to the CompileContext of its last compile, so that that compile's graphs share them)
_families: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def of_traced_function() -> Families:
    """The families of the function Dynamo is compiling now (new ones outside a trace, and at a
    function's first compile: its first, or its first since `torch._dynamo.reset()`)."""
    code, context, compile_id = _traced()
    if code is None:
        return Families()
    with _lock:
        _, families, made_in = _families.pop(id(code), (code, None, None))
        same_compile = made_in is not None and made_in() is context  # (another graph of it: a break)
        recompile = getattr(compile_id, "frame_compile_id", 0) != 0
        if families is None or not (same_compile or recompile):
            families = Families()
        elif recompile:  # traced again: its values named anew (`arg1_1` for `arg0_1`), its kernels alike
            families.match_renamed = True
        _families[id(code)] = (code, families, weakref.ref(context))  # the most recent last
        while len(_families) > LIMIT:
            _families.popitem(last=False)
        return families


def _traced() -> tuple:
    """(the code object of the frame Dynamo is translating, its CompileContext, its CompileId), or
    Nones outside a trace."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._guards import CompileContext

        code = getattr(InstructionTranslator.current_tx(), "f_code", None)
        context = CompileContext.get()
        weakref.ref(context)  # (a context that cannot be referenced so: no sharing)
        return code, context, context.compile_id
    except Exception:  # noqa: BLE001 - no trace in progress (or a torch without this API)
        return None, None, None
