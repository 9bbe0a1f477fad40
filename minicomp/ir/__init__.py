"""The IR: a typed graph of ATen nodes (op, shape, strides, dtype) made from a torch.fx graph.

graph.py    TensorMeta, Node, Graph; from_fx()
cse.py      common_subexpressions(): an op computed twice on the same arguments computed once
whole_scatters.py  whole_scatters(): a slice_scatter over its whole base is its source
dtypes.py   dtype tables: Triton names, compute dtypes, 16-bit rounding
"""

from minicomp.ir.graph import RESERVED, Graph, Node, Ref, SymbolicSize, TensorMeta, from_fx, fx_names, is_reserved

__all__ = ["RESERVED", "Graph", "Node", "Ref", "SymbolicSize", "TensorMeta", "from_fx", "fx_names", "is_reserved"]
