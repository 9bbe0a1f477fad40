"""Plan: an IR graph -> kernels, extern calls and their order.

pad_matmuls.py       matmul sizes cuBLAS runs slowly padded with zeros (a graph rewrite)
split_reductions.py  long reductions split K ways into partial results (a graph rewrite)
reduction_space.py   a reduction's space (reduced value shape + reduced dims) and row form
steps.py             what a plan is made of: kernel kinds (Pointwise-, ..., MatmulKernel), externs, Plan
stages.py            each node's kind, stage and whether it is materialized (fusion's rules 1-3)
fusion.py            which values become which kernels (rules 4-5); why two did not fuse
recompute.py         rule 3 priced: a value later stages would recompute from more bytes is written once
apart.py             rule 4's limit: values that share nothing, each reading a large buffer, run apart
scatter.py           scatter kernels: a scatter-add's stage, what it reads, how its output starts
scan.py              scan kernels: a cumsum's stage and how its kernel walks the scanned dim
matmul.py            matmul kernels: which matmuls run as a template (the setting), the epilogue each stores
row_reads.py         where a reduction kernel reads its reductions: a read at another row is cut (rule 5)
schedule.py          the order of steps, for peak memory
storages.py          which buffers share memory
"""
