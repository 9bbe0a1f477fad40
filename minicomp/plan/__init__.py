"""Plan: an IR graph -> kernels, extern calls and their order.

split_reductions.py  long reductions split K ways into partial results (a graph rewrite)
reduction_space.py   a reduction's space (reduced value shape + reduced dims) and row form
fusion.py            which nodes become which kernels; why two did not fuse
schedule.py          the order of steps, for peak memory
storages.py          which buffers share memory
"""
