"""The matmul template's seams (issue #40): which consumers plan/matmul.py takes as the epilogue
and which it leaves, MatmulLaunch's tiles, grid and candidates, and (slow) the generated kernel
compiled for an H100 (sm_90) by Triton on this CPU: every tile, bf16 and float32."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch
from conftest import check, kernel_count

import minicomp
from minicomp import config
from minicomp.codegen.templates import ENV
from minicomp.runtime.launch_spec import MatmulLaunch, matmul_tiles


def _plan(fn, *args) -> str:
    with config.override(matmul="template"):
        return str(minicomp.jit(fn).compiled(*args).plan)


def test_a_transposed_read_of_the_product_is_not_its_epilogue():
    x, w, y = torch.randn(6, 10), torch.randn(10, 14), torch.randn(14, 6)
    fn = lambda x, w, y: (x @ w).t() * 2 + y  # noqa: E731
    with config.override(matmul="template"):
        check(fn, x, w, y, kernels=2)
    text = _plan(fn, x, w, y)
    assert "writes ['mm']" in text and "matmul template" in text


def test_a_reduction_of_the_product_reads_it_from_memory():
    x, w = torch.randn(6, 10), torch.randn(10, 14)
    fn = lambda x, w: torch.softmax(torch.relu(x @ w), -1)  # noqa: E731
    with config.override(matmul="template"):
        check(fn, x, w, kernels=2)


def test_epilogue_of_a_broadcast_product_is_not_taken():
    """A consumer that reads the product at several of its elements (broadcast against a larger
    tensor) is not the template's: the product is written and read back."""
    x, w, y = torch.randn(5, 7), torch.randn(7, 3), torch.randn(4, 5, 3)
    with config.override(matmul="template"):
        check(lambda x, w, y: (x @ w) + y, x, w, y, kernels=2)


def test_launch_spec_tiles_grid_and_candidates():
    tiles = matmul_tiles(8192, 512, 256, 2, torch.device("cuda"))
    assert 1 <= len(tiles) <= 5 and tiles[0] == (128, 128, 64, 8, 3)
    spec = MatmulLaunch(batch=2, m=8192, n=512, k=256, tiles=tiles)
    assert eval(repr(spec)) == spec  # the generated line is the call that makes it
    assert spec.grid(1) == 2 * 64 * 4
    assert [c for c, _ in spec.candidates()] == [1 << i for i in range(len(tiles))]
    code, warps = spec.heuristic(torch.device("cuda"))
    assert spec.grid(code) >= 264 and warps == spec.tile(code)[3]
    small = matmul_tiles(33, 17, 45, 4, torch.device("cuda"))
    assert all(t[0] <= 64 and t[1] <= 32 and t[2] <= 64 for t in small)  # clamped to the sizes
    assert matmul_tiles(33, 17, 45, 4, torch.device("cpu")) == ((64, 32, 64, 1, 1),)
    skinny = matmul_tiles(1, 2048, 2048, 2, torch.device("cuda"))  # a decoding step's projection
    assert skinny[0] == (16, 16, 256, 2, 4) and all(t[0] == 16 and t[1] <= 64 for t in skinny)
    decode = MatmulLaunch(batch=1, m=1, n=2048, k=2048, tiles=skinny)
    assert decode.grid(decode.heuristic(torch.device("cuda"))[0]) == 128  # a program per 16 columns


def _linear_relu(x, w, b):
    return torch.relu(torch.nn.functional.linear(x, w, b))


def _chain(x, w, b, w2):  # a 2-layer MLP: one kernel, nested K loops (plan/matmul_folding.py `chainable`)
    return torch.nn.functional.linear(_linear_relu(x, w, b), w2)


@pytest.mark.slow  # Triton compiles each tile to a cubin (LLVM and ptxas) on the CPU: ~10 s
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fn, rows", [(_linear_relu, 96), (_chain, 96), (_linear_relu, 1)])  # 1: skinny tiles
def test_kernels_compile_for_sm90(dtype, fn, rows, monkeypatch, tmp_path):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    import minicomp.codegen.matmul as writer

    gpu = torch.device("cuda")
    monkeypatch.setattr(
        writer, "matmul_tiles", lambda m, n, k, size, device, **kw: matmul_tiles(m, n, k, size, gpu, **kw)
    )
    x, w, b = torch.randn(rows, 80, dtype=dtype), torch.randn(48, 80, dtype=dtype), torch.randn(48, dtype=dtype)
    args = (x, w, b) + ((torch.randn(64, 48, dtype=dtype),) if fn is _chain else ())
    with config.override(matmul="template"):
        source = minicomp.jit(fn).source(*args)
    assert kernel_count(source) == 1 and ("(chained)" in source) == (fn is _chain)
    kernel = re.search(r"^@triton\.jit\ndef (mc_\w+)\((.*?)\):.*?(?=^launch_)", source, flags=re.M | re.S)
    path = tmp_path / "kernel.py"
    helpers = ENV.get_template("combine.py.j2").render()  # the one-row form sums with `_sum`
    path.write_text("import triton\nimport triton.language as tl\n" + helpers + kernel.group(0))
    spec = importlib.util.spec_from_file_location("kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = [p.split(":")[0].strip() for p in kernel.group(2).split(",")]
    pointer = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}[dtype]
    signature = {p: pointer if p.endswith("_ptr") else "constexpr" if p == "TILE" else "i32" for p in names}
    tiles = len(re.findall(r"TILE == \d+:", kernel.group(0))) or 1
    assert tiles >= 2
    for i in range(tiles):
        fn = getattr(module, kernel.group(1))
        compiled = compile(
            ASTSource(fn, signature, {(names.index("TILE"),): 1 << i}),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4},
        )
        assert "cubin" in compiled.asm
        if dtype == torch.bfloat16 and rows > 16:  # (a skinny tile's 16 rows are below wgmma's 64)
            assert "warp_group_dot" in compiled.asm["ttgir"]  # Hopper's wgmma


@pytest.mark.parametrize("batched", [False, True])
def test_the_timed_probe_is_the_template(batched):
    """runtime/matmul_choice.py times templates/matmul.py.j2 itself, its product stored: run here
    in Triton's interpreter on transposed operands, it computes the product."""
    from minicomp.runtime import matmul_choice
    from minicomp.runtime.launch import _INTERPRETER_LOCK

    a = torch.randn(3, 24, 19).transpose(1, 2) if batched else torch.randn(24, 19).t()  # [.., 19, 24], column-major
    b = torch.randn(3, 24, 33) if batched else torch.randn(24, 33)
    layouts = [(tuple(t.shape), t.stride()) for t in (a, b)]
    tiles = matmul_tiles(19, 33, 24, 4, torch.device("cpu"))
    kernel = matmul_choice._kernel(torch.float32, torch.device("cpu"), *layouts, tiles)
    out = torch.empty((3, 19, 33) if batched else (19, 33))
    spec = MatmulLaunch(batch=3 if batched else 1, m=19, n=33, k=24, tiles=tiles)
    with _INTERPRETER_LOCK:
        kernel[(spec.grid(1),)](a, b, out, out.numel(), TILE=1, num_warps=1)
    torch.testing.assert_close(out, a @ b)


def test_the_choice_is_measured_once_and_remembered(monkeypatch):
    """`template_pays` times both sides once per shape and remembers the answer: a second ask
    (a warm process) measures nothing. A measurement that fails answers ATen."""
    import contextlib

    from minicomp.runtime import matmul_choice

    monkeypatch.setattr(matmul_choice, "_key", lambda *parts: "test_" + str(abs(hash(parts))))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(matmul_choice, "_time_library", lambda *args: 1.0)
    monkeypatch.setattr(matmul_choice, "_time_template", lambda *args: {(64, 64, 32, 4): 0.5, (32, 32, 32, 4): 0.8})
    a, b = ((256, 64), (64, 1)), ((64, 128), (128, 1))
    cpu = torch.device("cpu")
    pays, why = matmul_choice.template_pays(torch.float16, cpu, a, b, (256, 128))
    assert pays and "0.5000 ms (tile (64, 64, 32, 4)) vs cuBLAS + epilogue 1.0000 ms" in why

    def fail(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr(matmul_choice, "_time_template", fail)
    assert matmul_choice.template_pays(torch.float16, cpu, a, b, (256, 128)) == (pays, why)
    monkeypatch.setattr(matmul_choice, "_time_template", lambda *args: {(64, 64, 32, 4): 0.99})
    pays, why = matmul_choice.template_pays(torch.float16, cpu, b, a, (64, 64))
    assert not pays and why.startswith("ATen: auto, timed")  # within the margin: cuBLAS
    monkeypatch.setattr(matmul_choice, "_time_library", fail)
    assert matmul_choice.template_pays(torch.bfloat16, cpu, a, b, (256, 128)) == (
        False,
        "ATen: auto, not timed (AssertionError)",
    )


def test_auto_on_cuda_asks_the_timing_for_a_matmul_with_an_epilogue(monkeypatch):
    """`choice` in "auto" for CUDA values (the graph's metas moved to "cuda"): no epilogue or a size
    under 16 keeps cuBLAS without timing; otherwise runtime/matmul_choice.py answers."""
    from dataclasses import replace

    from minicomp.plan import matmul as planning
    from minicomp.runtime import matmul_choice

    asked = []
    monkeypatch.setattr(matmul_choice, "template_pays", lambda *a: asked.append(a) or (True, "template: timed"))
    graph = minicomp.jit(lambda x, w: x @ w).compiled(torch.randn(32, 24), torch.randn(24, 8)).graph
    for name in graph.order:
        graph[name].meta = replace(graph[name].meta, device=torch.device("cuda", 0))
    with config.override(matmul="auto", matmul_min_macs=0):
        assert planning.choice(graph, "mm", False) == (False, "ATen: auto, no epilogue to fuse")
        assert planning.choice(graph, "mm", True) == (False, "ATen: auto, a size under 16")
        with config.override(matmul_max_macs=100):
            assert planning.choice(graph, "mm", True)[1] == "ATen: auto, over 100 multiply-adds"
    assert not asked
    graph = minicomp.jit(lambda x, w: x @ w).compiled(torch.randn(32, 24), torch.randn(24, 16)).graph
    for name in graph.order:
        graph[name].meta = replace(graph[name].meta, device=torch.device("cuda", 0))
    with config.override(matmul="auto"):
        assert planning.choice(graph, "mm", True) == (False, f"ATen: auto, under {1 << 24} multiply-adds")
    assert not asked
    with config.override(matmul="auto", matmul_min_macs=0):
        assert planning.choice(graph, "mm", True) == (True, "template: timed")
    assert asked == [(torch.float32, torch.device("cuda", 0), ((32, 24), (24, 1)), ((24, 16), (16, 1)), (32, 16))]


def test_every_gpu_tile_computes_the_product_in_the_interpreter(monkeypatch):
    """The kernel as written for a GPU (its 5 tiles behind `TILE`, grouped order over many tiles,
    wrapped rows, K's masked tail), each tile run by Triton's interpreter on odd sizes with the
    bias + ReLU epilogue and a transposed weight."""
    import minicomp.codegen.matmul as writer
    from minicomp.runtime.launch import _INTERPRETER_LOCK

    gpu = torch.device("cuda")
    monkeypatch.setattr(
        writer, "matmul_tiles", lambda m, n, k, size, device, **kw: matmul_tiles(m, n, k, size, gpu, **kw)
    )
    x, w, b = torch.randn(300, 100), torch.randn(200, 100), torch.randn(200)
    fn = lambda x, w, b: torch.relu(torch.nn.functional.linear(x, w, b))  # noqa: E731
    with config.override(matmul="template"):
        compiled = minicomp.jit(fn).compiled(x, w, b)
    [call] = compiled.kernels
    launch = compiled.launch(call)
    assert len(launch.spec.tiles) == 5
    assert call.buffers == ("x", "permute", "b", "relu")  # w read transposed, in place
    for i in range(5):
        out = torch.full((300, 200), float("nan"))
        args = call.arguments({"x": x, "permute": w.t(), "b": b, "relu": out})
        with _INTERPRETER_LOCK:
            launch.kernel[(launch.spec.grid(1 << i),)](*args, TILE=1 << i, num_warps=4)
        torch.testing.assert_close(out, fn(x, w, b), msg=f"tile {launch.spec.tiles[i]}")


def test_every_gpu_tile_of_a_bmm_in_the_interpreter(monkeypatch):
    """The batch as the outermost part of the program id, with every GPU tile."""
    import minicomp.codegen.matmul as writer
    from minicomp.runtime.launch import _INTERPRETER_LOCK

    gpu = torch.device("cuda")
    monkeypatch.setattr(
        writer, "matmul_tiles", lambda m, n, k, size, device, **kw: matmul_tiles(m, n, k, size, gpu, **kw)
    )
    q, k = torch.randn(3, 150, 40), torch.randn(3, 90, 40)
    fn = lambda q, k: torch.bmm(q, k.transpose(1, 2)) * 0.5  # noqa: E731
    with config.override(matmul="template"):
        compiled = minicomp.jit(fn).compiled(q, k)
    [call] = compiled.kernels
    launch = compiled.launch(call)
    views = {"q": q, "k": k}
    views.update({n: k.transpose(1, 2) for n in call.buffers if n not in ("q", "k") and n not in call.writes})
    for i in range(len(launch.spec.tiles)):
        out = torch.full((3, 150, 90), float("nan"))
        args = call.arguments({**views, call.writes[0]: out})
        with _INTERPRETER_LOCK:
            launch.kernel[(launch.spec.grid(1 << i),)](*args, TILE=1 << i, num_warps=4)
        torch.testing.assert_close(out, fn(q, k), msg=f"tile {launch.spec.tiles[i]}")


def test_tiles_fit_shared_memory_with_a_prologue():
    """A prologue loading a float32 weight for a bf16 product doubles b's bytes a step: the
    128 x 256 tile keeps 2 stages (sm_90 compile: 262400 bytes of shared memory at 3, over the
    H100's 232448; 180352 at 2); tiles without a prologue are unchanged."""
    from minicomp.codegen.matmul_tiles import fitting

    tiles = matmul_tiles(4096, 4096, 4096, 2, torch.device("cuda"))
    assert fitting(tiles, {"a": 2, "b": 2}, set(), 2) == tiles
    fitted = fitting(tiles, {"a": 2, "b": 4}, {"b"}, 2)
    assert fitted[1] == (128, 256, 64, 8, 2) and fitted[0] == tiles[0]
    assert fitting(tiles, {"a": 64, "b": 64}, {"a", "b"}, 2) == ((64, 64, 64, 4, 2),)  # none fits: the least


def test_every_gpu_tile_with_a_prologue_in_the_interpreter(monkeypatch):
    """The operand computed in the K loop (x * s), each GPU tile, K's tail masked (K = 100)."""
    x, s, w, b = torch.randn(300, 100), torch.randn(100), torch.randn(200, 100), torch.randn(200)
    fn = lambda x, s, w, b: torch.relu(torch.nn.functional.linear(x * s, w, b))  # noqa: E731
    compiled, _ = _at_each_gpu_tile(monkeypatch, fn, x, s, w, b)
    assert "a computed as it is loaded" in compiled.source


def _at_each_gpu_tile(monkeypatch, fn, x, s, w, b, **tolerance):
    """`fn(x, s, w, b)`, a linear of w compiled as one template for the GPU's tiles, run at each
    tile in the interpreter against eager; (the compiled signature, its launch)."""
    import minicomp.codegen.matmul as writer
    from minicomp.runtime.launch import _INTERPRETER_LOCK

    gpu = torch.device("cuda")
    monkeypatch.setattr(
        writer, "matmul_tiles", lambda m, n, k, size, device, **kw: matmul_tiles(m, n, k, size, gpu, **kw)
    )
    with config.override(matmul="template"):
        compiled = minicomp.jit(fn).compiled(x, s, w, b)
    [call] = compiled.kernels
    launch = compiled.launch(call)
    values = {"x": x, "s": s, "w": w, "b": b}
    values.update({n: w.t() for n in call.buffers if n not in values and n not in call.writes})
    expected = fn(x, s, w, b)
    for i in range(len(launch.spec.tiles)):
        out = torch.full(expected.shape, float("nan"))
        args = call.arguments({**values, call.writes[0]: out})
        with _INTERPRETER_LOCK:
            launch.kernel[(launch.spec.grid(1 << i),)](*args, TILE=1 << i, num_warps=4)
        torch.testing.assert_close(out, expected, msg=f"tile {launch.spec.tiles[i]}", **tolerance)
    return compiled, launch


def test_every_gpu_tile_of_a_chain_in_the_interpreter(monkeypatch):
    """A 3-layer MLP as one kernel (two levels of chained products), each GPU tile (whole
    widths: `chain_tiles`), odd sizes; the hidden values never leave the kernel."""
    import minicomp.codegen.matmul as writer
    from minicomp.runtime.launch import _INTERPRETER_LOCK

    gpu = torch.device("cuda")
    monkeypatch.setattr(
        writer, "matmul_tiles", lambda m, n, k, size, device, **kw: matmul_tiles(m, n, k, size, gpu, **kw)
    )
    x = torch.randn(300, 100)
    w1, b1, w2, w3 = torch.randn(72, 100) / 10, torch.randn(72), torch.randn(40, 72) / 8, torch.randn(24, 40) / 6

    def fn(x, w1, b1, w2, w3):
        return torch.nn.functional.linear(torch.tanh(_chain(x, w1, b1, w2)), w3)

    with config.override(matmul="template"):
        compiled = minicomp.jit(fn).compiled(x, w1, b1, w2, w3)
    [call] = compiled.kernels
    launch = compiled.launch(call)
    assert compiled.source.count("(chained)") == 2
    assert {(t[1], t[2]) for t in launch.spec.tiles} == {(32, 64)}  # whole widths: N 24 -> 32, K 40 -> 64
    values = {"x": x, "w1": w1, "b1": b1, "w2": w2, "w3": w3}
    views = [n for n in call.buffers if n not in values and n not in call.writes]
    assert len(views) == 3  # the weights' transposing views (ATen permutes, read at their strides)
    values.update({n: values[compiled.graph[n].args[0].name].t() for n in views})
    for i in range(len(launch.spec.tiles)):
        out = torch.full((300, 24), float("nan"))
        args = call.arguments({**values, call.writes[0]: out})
        with _INTERPRETER_LOCK:
            launch.kernel[(launch.spec.grid(1 << i),)](*args, TILE=1 << i, num_warps=4)
        torch.testing.assert_close(out, fn(x, w1, b1, w2, w3), msg=f"tile {launch.spec.tiles[i]}", atol=1e-4, rtol=1e-4)


def test_auto_takes_an_mlps_last_layer_into_its_chain(monkeypatch):
    """In "auto" on CUDA (metas moved there), the last layer of an MLP has no epilogue, so timing
    would keep it with cuBLAS; its operand a is a chosen template's epilogue within the chain
    width, so it is taken too, and the plan chains both into one kernel."""
    from dataclasses import replace

    from minicomp.plan import matmul as planning
    from minicomp.plan.matmul_folding import chain_ends
    from minicomp.plan.matmul_reads import MATMULS, epilogues
    from minicomp.runtime import matmul_choice

    monkeypatch.setattr(matmul_choice, "template_pays", lambda *a: (True, "template: timed"))
    x, w1, b1, w2 = torch.randn(64, 32), torch.randn(48, 32), torch.randn(48), torch.randn(16, 48)
    compiled = minicomp.jit(_chain).compiled(x, w1, b1, w2)
    plan, graph = compiled.plan, compiled.graph
    for name in graph.order:
        graph[name].meta = replace(graph[name].meta, device=torch.device("cuda", 0))
    externs = [n for n in graph.order if graph[n].op_name in MATMULS]
    readers = epilogues(plan, externs)
    with config.override(matmul="auto", matmul_min_macs=0):
        chosen = {e: "timed" for e in externs if planning.choice(graph, e, any(e in h for h in readers.values()))[0]}
        assert len(chosen) == 1  # the first layer (its ReLU); the last has no epilogue
        ends = chain_ends(plan, externs, readers, chosen)
        assert list(ends) == [e for e in externs if e not in chosen] and "chained to" in next(iter(ends.values()))
        with config.override(matmul_chain_width=32):
            assert chain_ends(plan, externs, readers, chosen) == {}


def test_one_row_tiles_and_their_heuristic():
    """A product of one row whose b is read along K takes ROW_TILES (one row a program, no tl.dot's
    16), blocks clamped to the sizes; the launch's default is the first tile, and on the CPU one tile."""
    from minicomp.runtime.launch_spec import ROW_TILES, one_row

    cuda = torch.device("cuda")
    assert one_row(1, (1, 2048)) and not one_row(1, (2048, 1)) and not one_row(2, (1, 2048))
    assert matmul_tiles(1, 2048, 2048, 2, cuda, row=True) == ROW_TILES
    small = matmul_tiles(1, 3, 300, 2, cuda, row=True)
    assert all(t[0] == 1 and t[1] <= 4 and t[2] <= 512 for t in small) and len(set(small)) == len(small)
    spec = MatmulLaunch(batch=1, m=1, n=2048, k=2048, tiles=ROW_TILES)
    assert spec.heuristic(cuda) == (1, ROW_TILES[0][3]) and spec.grid(1) == 2048 // ROW_TILES[0][1]
    assert matmul_tiles(1, 48, 80, 4, torch.device("cpu"), row=True) == ((1, 16, 64, 1, 1),)


@pytest.mark.parametrize("prologue", [False, True])
def test_every_gpu_row_tile_in_the_interpreter(monkeypatch, prologue):
    """The one-row form at each GPU tile, K's tail masked (K = 700: one step of 1024, two of 512),
    N odd, a bias and ReLU epilogue; with a prologue the row is computed as it is loaded (x * s)."""
    x, s, w, b = torch.randn(1, 700), torch.randn(700), torch.randn(37, 700), torch.randn(37)
    fn = (
        (lambda x, s, w, b: torch.relu(torch.nn.functional.linear(x * s, w, b)))
        if prologue
        else (lambda x, s, w, b: torch.relu(torch.nn.functional.linear(x, w, b)))
    )
    # (sums of 700 products in another order than ATen's)
    compiled, launch = _at_each_gpu_tile(monkeypatch, fn, x, s, w, b, atol=1e-4, rtol=1e-5)
    assert "one row of a times b" in compiled.source and "tl.dot(" not in compiled.source
    assert ("a computed as it is loaded" in compiled.source) == prologue
    assert {t[0] for t in launch.spec.tiles} == {1} and len(launch.spec.tiles) >= 4


def test_the_timed_probe_of_one_row():
    """runtime/matmul_choice.py times the one-row form too: a row of 300 against a [37, 300]
    weight's transpose, in the interpreter."""
    from minicomp.runtime import matmul_choice
    from minicomp.runtime.launch import _INTERPRETER_LOCK

    a, w = torch.randn(1, 300), torch.randn(37, 300)
    layouts = [(tuple(t.shape), t.stride()) for t in (a, w.t())]
    tiles = matmul_tiles(1, 37, 300, 4, torch.device("cpu"), row=True)
    kernel = matmul_choice._kernel(torch.float32, torch.device("cpu"), *layouts, tiles, True)
    out = torch.empty(1, 37)
    spec = MatmulLaunch(batch=1, m=1, n=37, k=300, tiles=tiles)
    with _INTERPRETER_LOCK:
        kernel[(spec.grid(1),)](a, w.t(), out, out.numel(), TILE=1, num_warps=1)
    torch.testing.assert_close(out, a @ w.t())


def test_row_products_launch_splits_its_programs_among_its_pieces():
    """RowProductsLaunch (codegen/row_products.py): each piece's programs after the previous one's,
    at its first tile's warps, never tuned; its repr is the generated line's call."""
    from minicomp.runtime.launch_spec import RowProductsLaunch

    cuda = torch.device("cuda")
    pieces = tuple(
        MatmulLaunch(batch=1, m=1, n=n, k=2048, tiles=matmul_tiles(1, n, 2048, 2, cuda, row=True)[:1])
        for n in (2048, 512, 512)
    )
    spec = RowProductsLaunch(pieces=pieces)
    assert spec.starts() == [0, 1024, 1280, 1536] and spec.grid(1) == 1536
    assert spec.heuristic(cuda) == (1, 4) and spec.candidates() == [(1, 4)] and not spec.tuned()
    assert eval(repr(spec)) == spec and spec.work == (2048 + 512 + 512) * 2048


def test_the_persistent_key_holds_the_one_row_settings():
    """A second process that turns the one-row template off (config matmul_rows, or a larger
    matmul_row_min_k) does not load a module an earlier one stored with it (dispatch/persist.py)."""
    from minicomp.dispatch import persist

    base = persist.key("fingerprint", ("signature",))
    with config.override(matmul_rows=False):
        assert persist.key("fingerprint", ("signature",)) != base
    with config.override(matmul_row_min_k=1 << 20):
        assert persist.key("fingerprint", ("signature",)) != base
    assert persist.key("fingerprint", ("signature",)) == base
