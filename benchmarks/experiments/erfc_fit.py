"""The polynomial of the 16-bit erfc (lowering/ops/fast_math.py `ERFC16`), fitted again, and its error.

    python -m benchmarks.experiments.erfc_fit OUT.json

erfc(a) = t exp(P(t) - a^2), t = 1 / (1 + a/2), a >= 0 (Numerical Recipes' erfcc, whose P has
degree 9 and reaches 1.2e-7). For each degree, P is fitted to log(erfc(a) / t) + a^2 on a grid
of a in [0, 10] by least squares, reweighted towards the largest errors (a cheap minimax), and
evaluated the way the kernel does: float32 Horner, exp, product. The reported error is the
largest relative error of erfc where it is a normal float32. Degree 5 (2.2e-5) is what
pointwise.py uses: below a bfloat16 or float16 half-ulp (2e-3, 4.9e-4) with room; degree 4
(1.9e-4) leaves too little under float16's. CPU only: --tiny runs the same fit on a coarser grid.
"""

from __future__ import annotations

import math

import numpy as np

from benchmarks.experiments import harness
from minicomp.lowering.ops.fast_math import ERFC16


def fit(degree: int, points: int) -> list[float]:
    a = np.linspace(0.0, 10.0, points)
    t = 1.0 / (1.0 + 0.5 * a)
    target = np.log(np.array([math.erfc(v) for v in a]) / t) + a * a
    weight = np.ones_like(t)
    vander = np.vander(t, degree + 1)
    for _ in range(30):
        coef, *_ = np.linalg.lstsq(vander * weight[:, None], target * weight, rcond=None)
        err = np.abs(vander @ coef - target)
        weight = weight * (1 + 5 * err / err.max())
        weight /= weight.mean()
    return [float(c) for c in coef]


def max_relative_error(coef, points: int) -> float:
    a = np.linspace(0.0, 10.0, points).astype(np.float32)
    t = (np.float32(1) / (np.float32(1) + np.float32(0.5) * a)).astype(np.float32)
    poly = np.zeros_like(t)
    for c in coef:
        poly = (poly * t + np.float32(c)).astype(np.float32)
    value = (t * np.exp((poly - a * a).astype(np.float32))).astype(np.float64)
    exact = np.array([math.erfc(float(v)) for v in a])
    normal = exact >= np.finfo(np.float32).tiny
    return float(np.max(np.abs(value[normal] / exact[normal] - 1)))


def main(argv=None):
    run = harness.parse(argv, __doc__)
    points = 2_000 if run.tiny else 20_000
    rows = []
    for degree in (4, 5, 6):
        coef = fit(degree, points)
        rows.append(dict(degree=degree, coef=coef, max_relative_error=max_relative_error(coef, points)))
        print(f"degree {degree}: max relative error {rows[-1]['max_relative_error']:.2e}", flush=True)
    used = max_relative_error(ERFC16, points)
    print(f"fast_math.ERFC16: max relative error {used:.2e}")
    run.write(rows=rows, used=dict(coef=list(ERFC16), max_relative_error=used))


if __name__ == "__main__":
    main()
