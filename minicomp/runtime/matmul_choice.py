"""Timing a matmul template against cuBLAS and a separate epilogue kernel: which is faster here?

In "auto" on CUDA, plan/matmul.py asks `template_pays` once per class of shapes (operand
layouts and dtype, sizes by their class: size_classes.py) for a matmul with an epilogue to
fuse; the answer is remembered in the tuning cache, so a warm process, and a new length of
the same class, measures nothing. The two sides, each on random operands laid out as
the graph's (runtime/matmul_timing.py's approach):

    library   ATen's mm (bmm) into the product, then one in-place pass over it (`relu_`): what a
              fused epilogue kernel adds to cuBLAS, a read and a write of the product and a launch
    template  templates/matmul.py.j2 itself, rendered with a store of the product as its only
              epilogue, each of its tiles (launch_spec.matmul_tiles) timed, the fastest kept

What both sides read besides (a bias, a residual) is the same on each and left out. The template
is taken where it is faster by more than the noise (`MARGIN`). A measurement that cannot run
(out of memory, a compile error) answers "library".
"""

from __future__ import annotations

import hashlib

import torch

from minicomp import config, logs
from minicomp.runtime import cache
from minicomp.runtime.launch_spec import MatmulLaunch, matmul_tiles, one_row
from minicomp.runtime.matmul_timing import _operand, _real_tensors
from minicomp.runtime.size_classes import Layout, bucket, layout_class
from minicomp.runtime.tuning import median_ms

TIMED_RUNS = 10
MARGIN = 0.97  # the template must take under 97% of the library's time


def template_pays(
    dtype: torch.dtype, device: torch.device, a: Layout, b: Layout, out_shape: tuple[int, ...]
) -> tuple[bool, str]:
    """(whether the template with its epilogue beats ATen's matmul + an epilogue kernel for
    operands laid out as `a` and `b` ([B,] M, K and [B,] K, N), why: the two times)."""
    classes = layout_class(a), layout_class(b), tuple(bucket(n) for n in out_shape)
    path = cache.file("tuning", f"matmul_{_key(dtype, device, *classes)}.json")
    record = cache.read_record(path)
    if record is not None and isinstance(record.get("template"), bool) and isinstance(record.get("why"), str):
        return record["template"], record["why"]
    if not config.get("measure_matmuls"):
        return False, "ATen: auto, not timed (config measure_matmuls off)"
    try:
        with _real_tensors(), torch.cuda.device(device):
            library, template = _time_library(dtype, device, a, b, out_shape), _time_template(dtype, device, a, b)
    except Exception as err:  # noqa: BLE001 - no measurement: cuBLAS, as without the template
        logs.fusion.info("matmul %s @ %s not timed (%s: %s): ATen", a[0], b[0], type(err).__name__, err)
        return False, f"ATen: auto, not timed ({type(err).__name__})"
    best = min(template, key=template.get)
    pays = template[best] < MARGIN * library
    why = (
        f"{'template' if pays else 'ATen'}: auto, timed {template[best]:.4f} ms (tile {best}) "
        f"vs cuBLAS + epilogue {library:.4f} ms"
    )
    logs.fusion.info("matmul %s @ %s %s: %s", a[0], b[0], dtype, why)
    cache.write_record(
        path,
        {"template": pays, "why": why, "library_ms": library, "tiles_ms": {str(t): ms for t, ms in template.items()}},
    )
    return pays, why


def _key(*parts) -> str:
    text = "\n".join([repr(parts), torch.cuda.get_device_name(parts[1]), torch.__version__, _template_text()])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _time_library(dtype, device, a: Layout, b: Layout, out_shape) -> float:
    x, y = _operand(a, dtype, device), _operand(b, dtype, device)
    out = torch.empty(out_shape, dtype=dtype, device=device)
    mm = torch.bmm if len(out_shape) == 3 else torch.mm

    def run():
        mm(x, y, out=out)
        out.relu_()

    run()
    return median_ms(run, TIMED_RUNS)


def _time_template(dtype, device, a: Layout, b: Layout) -> dict[tuple, float]:
    """Milliseconds of the template (its product stored, nothing else) at each of its tiles."""
    (shape_a, _), (shape_b, _) = a, b
    batch = shape_a[0] if len(shape_a) == 3 else 1
    m, k, n = shape_a[-2], shape_a[-1], shape_b[-1]
    row = one_row(m, b[1])
    tiles = matmul_tiles(m, n, k, dtype.itemsize, device, row=row)
    kernel = _kernel(dtype, device, a, b, tiles, row)
    x, y = _operand(a, dtype, device), _operand(b, dtype, device)
    out = torch.empty(((batch,) if len(shape_a) == 3 else ()) + (m, n), dtype=dtype, device=device)
    spec = MatmulLaunch(batch=batch, m=m, n=n, k=k, tiles=tiles)
    times = {}
    for i, tile in enumerate(tiles):
        code = 1 << i

        def run(code=code, warps=tile[3]):
            kernel[(spec.grid(code),)](x, y, out, out.numel(), TILE=code, num_warps=warps)

        run()  # compiles, outside the timed runs
        times[tile[:3] + tile[4:]] = median_ms(run, TIMED_RUNS)
    return times


def _template_text() -> str:
    return (config.templates_directory() / "matmul.py.j2").read_text()


def _kernel(dtype, device, a: Layout, b: Layout, tiles, row: bool = False):
    """templates/matmul.py.j2 with the product's store as its epilogue, loaded as a module."""
    import jinja2

    from minicomp.runtime.loader import load

    (shape_a, stride_a), (shape_b, stride_b) = a, b
    batched = len(shape_a) == 3
    m, k, n = shape_a[-2], shape_a[-1], shape_b[-1]
    triton_dtype = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32"}[dtype]
    offset = f"{m * n}*x0 + {n}*x1 + x2" if batched else f"{n}*x0 + x1"
    names = (
        ["x0 = pid_b", "x1 = rm[:, None]", "x2 = rn[None, :]"] if batched else ["x0 = rm[:, None]", "x1 = rn[None, :]"]
    )
    spans = [sum((s - 1) * st for s, st in zip(shape, stride)) for shape, stride in (a, b)]
    tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(config.templates_directory()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    text = env.get_template("matmul.py.j2").render(
        header=["a matmul template timed against cuBLAS (runtime/matmul_choice.py)"],
        name="mc_matmul_probe",
        params=["a_ptr", "b_ptr", "out_ptr"],
        sizes=[],
        unspecialized=[],
        tiles=tiles,
        row=row,
        piece=False,
        batch=shape_a[0] if batched else 1,
        m=m,
        n=n,
        k=k,
        wide_index=max(spans + [(shape_a[0] if batched else 1) * m * n]) >= 2**31,
        a_pointer="a_ptr",
        b_pointer="b_ptr",
        a_strides=stride_a[-2:],
        b_strides=stride_b[-2:],
        a_base=f"pid_b * {stride_a[0]} + " if batched and shape_a[0] > 1 else "",
        b_base=f"pid_b * {stride_b[0]} + " if batched and shape_b[0] > 1 else "",
        precision="" if dtype != torch.float32 else f', input_precision="{"tf32" if tf32 else "ieee"}"',
        upcast="",
        a_prologue=[],
        b_prologue=[],
        body=names + [f"tl.store(out_ptr + ({offset}), acc.to({triton_dtype}), mask=mask)"],
        launcher="probe",
        spec="None",
        device=str(device),
    )
    header = (
        "import torch\nimport triton\nimport triton.language as tl\n\n" + env.get_template("combine.py.j2").render()
    )
    source = header + text.rsplit("probe = Launch(", 1)[0]  # the kernel alone: it is launched by hand
    return load(source, "matmul_probe", interpret=device.type == "cpu").mc_matmul_probe
