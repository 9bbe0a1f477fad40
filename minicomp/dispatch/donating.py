"""A function of tensors compiled by minicomp for one signature, with the memory of some of its
arguments given to the call: a kernel may write a result over an argument it reads for the last
time (codegen/reuse.py, as a backward's saved logits take their gradient).

    joint = Donating(forward_and_backward, donated=(0,), name="chunk_joint")
    results = joint(logits, *sides)   # logits [rows, V] is gone: its memory holds their gradient

The caller promises not to read a donated argument after the call and that no other tensor it
passes or keeps shares its memory. `chunked_rows.Region.joint` uses it so that a chunk of a
vocabulary projection holds one [rows, V] value (the product, then its gradient), not two.

The first call compiles (trace, pipeline) and runs on a copy of the donated arguments, so that a
kernel failing at its first launch leaves them whole for the fallback (the function as written,
by the fallback policy); later calls write over them.
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from minicomp import capture, config
from minicomp.dispatch import fallback
from minicomp.dispatch.entries import Entry
from minicomp.lowering.layout import extent


class Donating:
    """`fn(*tensors)`, compiled at its first call for that call's signature, the arguments at
    positions `donated` handed over to the call. Later calls must have the same signature
    (shapes, strides, dtypes, devices): the caller keys one `Donating` per signature."""

    def __init__(self, fn, donated: tuple[int, ...], name: str, policy: str | None = None):
        self.fn, self.donated, self.name = fn, tuple(donated), name
        self.policy = config.fallback(policy)
        self.run = None  # the call, once compiled (or the function as written, after a failure)
        self.compiled = None  # pipeline.Compiled, for looking inside
        self._taken: bool | None = None  # `taken`, once read

    def __call__(self, *args):
        if self.run is None:
            return self._first_call(list(args))
        return self.run(*args)

    def _first_call(self, args: list):
        from minicomp.codegen.families import Families
        from minicomp.pipeline import compile_graph

        in_spec = pytree.tree_flatten((tuple(args), {}))[1]
        names = [f"donated_{i}" if i in self.donated else f"arg_{i}" for i in range(len(args))]
        gift = frozenset(names[i] for i in self.donated)
        try:
            traced = capture.trace(self.fn, list(args), in_spec, names)
            compiled = compile_graph(
                traced.gm,
                self.name,
                traced.input_names,
                Families(),
                freed_inputs=gift,
                donated=gift,
                results_over_donated=True,
            )
            returned = {getattr(record, "slot", None) for record in traced.outputs.records}
            if compiled.graph.mutations or returned & set(self.donated):
                raise NotImplementedError("a function that writes into or returns a donated argument takes no donation")
            entry = Entry(compiled.call, traced.tensor_slots, len(args), traced.outputs, [], compiled)
            copies = [_copy(a) if i in self.donated else a for i, a in enumerate(args)]
            result = entry(self.fn, copies, in_spec)
            entry.ran = True
        except Exception as err:  # noqa: BLE001 - the function as written, by the policy
            fallback.handle(self.name, err, self.policy)
            self.run = self.fn
            return self.fn(*args)
        self.compiled = compiled
        self.run = lambda *call_args: entry(self.fn, call_args, in_spec)
        return result

    @property
    def taken(self) -> bool:
        """Whether the compiled call writes a result into a donated argument's memory (a kernel
        reads the argument after its last store there, say, and it does not). Read from the
        wrapper once (a chunked loss asks after every chunk)."""
        if self.compiled is None:
            return False
        if self._taken is None:
            results = {o for o in self.compiled.graph.outputs if isinstance(o, str)}
            lines = self.compiled.source.split("def call_boxed", 1)[-1].splitlines()
            self._taken = any(
                line.split("=", 1)[0].strip() in results
                and any(over in line for over in ("= donated_", "reinterpret(donated_", "over_or_empty(donated_"))
                for line in lines
            )
        return self._taken


def _copy(value: torch.Tensor) -> torch.Tensor:
    """`value` in memory of its own at its own strides (a padded product's [rows, V] view keeps its
    row stride: the compiled code reads it there)."""
    span = extent(value.shape, value.stride())
    return value.as_strided((span,), (1,)).clone().as_strided(value.shape, value.stride())
