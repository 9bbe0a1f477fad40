"""Plan: an IR graph -> kernels, extern calls and their order.

split_reductions.py  long reductions split K ways into partial results (a graph rewrite)
reduction_space.py   a reduction's space (reduced value shape + reduced dims) and row form
steps.py             what a plan is made of: kernel kinds (PointwiseKernel, ReductionKernel), externs, Plan
stages.py            each node's kind, stage and whether it is materialized (fusion's rules 1-3)
fusion.py            which values become which kernels (rule 4); why two did not fuse
schedule.py          the order of steps, for peak memory
storages.py          which buffers share memory
"""
