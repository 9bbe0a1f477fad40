"""A scatter of one value per row written as a select: `where(iota == index, src, self)`.

    scatter(self, dim, index, src)      index: self's shape with 1 along `dim`
 -> where(arange(self.shape[dim]) == index, src, self)      (broadcast along `dim`)

The two are equal wherever the indices are in range (a scatter raises otherwise). Autograd writes
a gather's gradient as such a scatter into zeros (cross-entropy's target column), and as a scatter
it is a kernel of its own over a zero-filled [rows, V] buffer; as a select it is pointwise, and
fuses into whatever reads it. Inductor's `scatter_upon_const_tensor` does the same.

`table()`: decompositions for make_fx, for graphs whose scatters' indices a gather of the same
graph reads first (chunked_rows.Region.joint: the region's backward), so an index out of range
fails there as it does in eager. A scatter of any other shape is left as it is.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _one_per_row(self: torch.Tensor, dim: int, index: torch.Tensor, src=None) -> bool:
    dim = dim % max(self.ndim, 1)
    rest = [d for d in range(self.ndim) if d != dim]
    return (
        index.ndim == self.ndim
        and index.shape[dim] == 1
        and all(index.shape[d] == self.shape[d] for d in rest)
        and (not isinstance(src, torch.Tensor) or src.shape == index.shape)
    )


def _hit(self: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    dim = dim % max(self.ndim, 1)
    shape = [1] * self.ndim
    shape[dim] = self.shape[dim]
    return torch.arange(self.shape[dim], device=self.device).view(shape) == index


def _scatter_src(self, dim, index, src):
    if not _one_per_row(self, dim, index, src):
        return NotImplemented
    return torch.where(_hit(self, dim, index), src.to(self.dtype), self)


def _scatter_value(self, dim, index, value):
    if not _one_per_row(self, dim, index):
        return NotImplemented
    return torch.where(_hit(self, dim, index), torch.scalar_tensor(value, dtype=self.dtype, device=self.device), self)


def _scatter_add(self, dim, index, src):
    if not _one_per_row(self, dim, index, src):
        return NotImplemented
    return self + torch.where(
        _hit(self, dim, index), src.to(self.dtype), torch.zeros((), dtype=self.dtype, device=self.device)
    )


def table() -> dict:
    return {
        aten.scatter.src: _scatter_src,
        aten.scatter.value: _scatter_value,
        aten.scatter_add.default: _scatter_add,
    }
