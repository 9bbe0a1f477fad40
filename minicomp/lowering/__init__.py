"""Lowering: how each ATen op becomes Triton expressions of an output index.

ops/         ONE table: ATen op -> pointwise expression, view (index rewrite), reduction or extern
indexing.py  index expressions: views, broadcast, slices and cat as masked loads
layout.py    the strides a value is written with (dense, in its inputs' order)
"""
