"""`ir.Node.inputs()`: the names a node reads, in argument order, each once; worked out once per
`args` and `kwargs` object, and again when either is replaced (a copied node given new arguments,
as the wrapper's renaming does)."""

from __future__ import annotations

import copy
import dataclasses

import torch

from minicomp.ir import Ref
from minicomp.ir.graph import Node

aten = torch.ops.aten


def test_names_in_argument_order_each_once_nested_and_keyword():
    node = Node("n", aten.cat.default, ([Ref("a"), Ref("b"), Ref("a")], 0), {"out": (Ref("c"), [Ref("b")])})
    assert node.inputs() == ["a", "b", "c"]


def test_a_new_list_each_call():
    node = Node("n", aten.add.Tensor, (Ref("a"), Ref("b")))
    node.inputs().append("z")
    assert node.inputs() == ["a", "b"]


def test_replaced_arguments_are_read_again():
    node = Node("n", aten.add.Tensor, (Ref("a"), Ref("b")))
    assert node.inputs() == ["a", "b"]
    copied = copy.copy(node)
    copied.args = (Ref("x"), 2.0)
    assert copied.inputs() == ["x"] and node.inputs() == ["a", "b"]
    copied.kwargs = {"alpha": Ref("y")}
    assert copied.inputs() == ["x", "y"]
    replaced = dataclasses.replace(node, args=(Ref("b"), Ref("c")))
    assert replaced.inputs() == ["b", "c"]
    assert node == Node("n", aten.add.Tensor, (Ref("a"), Ref("b")))  # (the kept names are no field)
