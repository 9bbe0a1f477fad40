"""Rows a chunk of a chunked region (issue #41, row_regions.py): from the memory budget
(config "chunk_budget_bytes") and the region's [rows, V] values, in the fewest chunks the budget
allows, of equal rows, so that no chunk is a small remainder."""

from __future__ import annotations

import torch.fx


def rows_a_chunk(nodes: list[torch.fx.Node], n: int, budget: int) -> int:
    """Rows a chunk of the region whose product is `nodes[0]` and whose other values are the rest
    (fx nodes with meta["val"], over `n` rows): `even_rows` of what the budget holds, or `n` when
    the whole product fits (one chunk: row_regions.py takes it only where the gradients come in
    the forward, so that no product is kept for the backward). On CUDA the region and its backward run as
    fused kernels (chunked_rows.Region.joint) that write the product's gradient over the product:
    one [rows, V] value of the product's dtype a row; elsewhere they run op by op: the region's
    widest value and its gradient."""
    values = [node.meta["val"] for node in nodes]
    per_row = max(v.numel() // n for v in values)
    product = values[0]
    if product.device.type == "cuda":
        row_bytes = per_row * product.dtype.itemsize
    else:
        row_bytes = 2 * per_row * max(v.dtype.itemsize for v in values)
    rows = budget // max(row_bytes, 1)
    return n if rows >= n else even_rows(n, rows)


def even_rows(n: int, most: int) -> int:
    """Rows a chunk of `n` rows in the fewest chunks of at most `most` rows, of equal rows (the
    last may be shorter): a multiple of 128 (the matmul's row tile) where `most` allows one.
    4096 rows at most 1280 a chunk: 4 chunks of 1024, not 3 of 1280 and one of 256."""
    tile = 128 if most >= 128 else 1
    most = max(most // tile * tile, 1)
    chunks = -(-n // most)
    even = -(-n // chunks)  # (at most `most`, and so is its next multiple of the tile)
    return -(-even // tile) * tile
