"""AOTAutograd's partition of the joint graph into the forward and backward minicomp compiles.

The min-cut rematerialization partition (as Inductor's), with three changes: views are never
saved (functorch's `recompute_views`: the backward takes them again from their base); with config
"recompute_for_memory" a cheap pointwise value that a non-fusible backward op reads whole is
recomputed rather than saved, and so is an expanding product (attention scores `q @ k^T`:
expanding_products.py); and repeated ops are merged by joint_cse.py, the partition's own
pass off (it imports Inductor). The saved values the backward reads at any strides are then
marked on the forward (saved_layouts.py).
"""

from __future__ import annotations

from minicomp import config, logs
from minicomp.dispatch import expanding_products, joint_cse, saved_layouts


def partition(joint, inputs, **kwargs):
    """The min-cut partition, saving no views (they are recomputed from what is saved); the
    saved values the backward reads at any strides are marked on the forward (saved_layouts.py).

    Config "recompute_for_memory" (on): a cheap pointwise value a non-fusible backward op reads whole
    (SwiGLU's `silu(gate) * up` for a matmul, a norm's output, GQA's repeated k and v) is recomputed
    in the backward, not saved, which AOTAutograd bans (`ban_recompute_materialized_backward`);
    so is a product much larger than its operands over a short contraction (expanding_products.py).
    Repeated ops are merged by joint_cse.py, the partition's own pass off."""
    import torch._functorch.config as functorch_config
    from functorch.compile import min_cut_rematerialization_partition

    settings = {"recompute_views": True}
    if config.get("recompute_for_memory"):
        settings["ban_recompute_materialized_backward"] = False
        tagged = expanding_products.mark(joint.graph)
        if tagged:
            logs.fusion.info("recomputed in the backward, not saved (expanding products): %s", ", ".join(tagged))
    if functorch_config.cse:  # merged here, without the import of Inductor the partition's pass makes
        joint.graph.eliminate_dead_code()
        joint.graph = joint_cse.merged(joint.graph)
        joint.recompile()
        settings["cse"] = False
    with functorch_config.patch(**settings):
        forward, backward = min_cut_rematerialization_partition(joint, inputs, **kwargs)
    saved_layouts.mark(forward, backward)
    return forward, backward
