"""Dispatch: what a call of a jitted function, module or Dynamo graph does.

jit.py            minicomp.jit: functions and modules alike
function.py       JitFunction: the signature key, the entry it finds or compiles, the call
arguments.py      a call's arguments as leaves and a spec (the key's structure)
entries.py        Entry and EagerEntry: what one signature runs (compiled module or the function as written)
hot_path.py       the signature that last ran, checked before the key (C++ tensor guards)
hot_source.py     ... written out as one Python function, a graphed record's replay inline
modules.py        JitModule: a module's forward with its parameters as inputs
autograd.py       training: AOTAutograd's forward and backward graphs, both compiled
partition.py      ... the joint graph split into them: min-cut, no views saved, cheap values recomputed
joint_cse.py      ... the joint graph's repeated ops merged before its partition (no Inductor import)
training_call.py  the lean autograd.Function a training call runs through
dynamo.py         torch.compile(backend="minicomp")
dynamic_graphs.py ... a graph whose sizes are symbols, compiled per size (or by static parts)
sized_contracts.py ... what each size's forward agrees with its backward (saved layouts, donations)
graphed_calls.py  ... its compiled graphs replaying CUDA graphs (mode="reduce-overhead")
frame_families.py the kernel families of a function Dynamo compiles, shared by its recompiles
guarded_calls.py  a Dynamo graph's first call that fails, run as captured instead
returned_views.py outputs that view an input or another output, returned as those views
donations.py      the saved activations a backward may write over (donated buffers)
row_regions.py    a matmul whose product only row reductions read (a loss), found and rewritten to chunks
chunk_tracing.py  the ATen graph that rewrite reads, traced from a Dynamo graph or jit's training function
chunked_rows.py   Region: such a region computed a chunk of rows at a time, forward and backward
chunked_ops.py    the custom ops a graph calls for it (opaque to AOTAutograd)
linear_tail.py    a loss linear in the region's results: the region's gradients made in its forward
lost_in_trace.py  what the rewrite's ATen trace would lose (grad-mode switches, autocast, detach)
persist.py        entries on disk, so a second process skips compiling
fallback.py       CompileError and the fallback policy (warn, silent, raise)
"""
