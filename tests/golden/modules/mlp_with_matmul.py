"""minicomp: generated module for `mlp` on cpu.

Inputs:
    x: float32[8, 16] stride (16, 1)
    wt: float32[16, 32] stride (32, 1)
    b: float32[32] stride (1,)

ATen graph:
    x: float32[8, 16] stride (16, 1) cpu = input
    wt: float32[16, 32] stride (32, 1) cpu = input
    b: float32[32] stride (1,) cpu = input
    mul: float32[8, 16] stride (16, 1) cpu = aten.mul.Tensor(x, 2.0)  # pointwise
    add: float32[8, 16] stride (16, 1) cpu = aten.add.Tensor(mul, 1.0)  # pointwise
    relu: float32[8, 16] stride (16, 1) cpu = aten.relu.default(add)  # pointwise
    mm: float32[8, 32] stride (32, 1) cpu = aten.mm.default(relu, wt)  # extern
    add_1: float32[8, 32] stride (32, 1) cpu = aten.add.Tensor(mm, b)  # pointwise
    sigmoid: float32[8, 32] stride (32, 1) cpu = aten.sigmoid.default(add_1)  # pointwise
    return ['sigmoid']

Plan:
    kernel mc_fused_mul_add_relu_0  stage 0  space [8, 16]
        computes ['mul', 'add', 'relu']
        reads ['x']  writes ['relu']
    extern mm = mm  stage 1
    kernel mc_fused_add_sigmoid_1  stage 1  space [8, 32]
        computes ['add_1', 'sigmoid']
        reads ['b', 'mm']  writes ['sigmoid']
    not fused:
        relu -> mm: mm runs as an ATen call: aten.mm has no pointwise, view or reduction lowering
        mm -> add_1: mm runs as an ATen call: aten.mm has no pointwise, view or reduction lowering
"""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minicomp.runtime import Launch, PointwiseLaunch, conform


# kernel 0: mul, add, relu
#   aten ops: mul, add, relu
#   iteration space: [8 x 16] (dims [0, 1] of [8, 16])
#   reads x; writes relu
@triton.jit
def mc_fused_mul_add_relu_0(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0)
    mul = x * 2.0  # aten.mul.Tensor
    add = mul + 1.0  # aten.add.Tensor
    relu = tl.where(add < 0, 0, add)  # aten.relu.default
    tl.store(out_ptr + offsets, relu, mask=mask)


launch_0 = Launch(mc_fused_mul_add_relu_0, PointwiseLaunch(numel=128), device="cpu")

# kernel 1: add_1, sigmoid
#   aten ops: add, sigmoid
#   iteration space: [8 x 32] (dims [0, 1] of [8, 32])
#   reads b, mm; writes sigmoid
@triton.jit
def mc_fused_add_sigmoid_1(mm_ptr, b_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x1 = offsets % 32
    mm = tl.load(mm_ptr + offsets, mask=mask, other=0)
    b = tl.load(b_ptr + x1, mask=mask, other=0)
    add_1 = mm + b  # aten.add.Tensor
    sigmoid = 1.0 / (1.0 + tl.exp(-add_1))  # aten.sigmoid.default
    tl.store(out_ptr + offsets, sigmoid, mask=mask)


launch_1 = Launch(mc_fused_add_sigmoid_1, PointwiseLaunch(numel=256), device="cpu")


def call(x, wt, b):
    return call_boxed([x, wt, b])


def call_boxed(args):
    """AOTAutograd's boxed convention: the list is emptied, so each input dies at its last use."""
    x, wt, b = args
    args.clear()
    with torch._C.DisableTorchFunction():  # (its ATen ops were traced: no mode sees them again)
        relu = torch.empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
        launch_0(x, relu, 128)  # mc_fused_mul_add_relu_0
        del x
        mm = torch._C._VariableFunctions.mm(relu, wt)  # binding of aten.mm.default
        del relu, wt
        if (mm.shape, mm.stride()) != ((8, 32), (32, 1)): mm = conform(mm, *((8, 32), (32, 1)), 'aten.mm.default')
        sigmoid = torch.empty_strided((8, 32), (32, 1), dtype=torch.float32, device='cpu')
        launch_1(mm, b, sigmoid, 256)  # mc_fused_add_sigmoid_1
        del b, mm
        return (sigmoid,)
