"""Benchmark output: markdown table, JSON, CSV and plots of time vs size."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

TARGET_X_FLOOR = 1.05


def progress(items, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety
        return items
    return tqdm(items, desc=desc)


def add_ratios(rows: list[dict]) -> None:
    """x_inductor: this row's time over Inductor's for the same workload, dtype and size."""
    inductor = {(r["workload"], r["dtype"], r["size"]): r.get("ms") for r in rows if r["impl"] == "inductor"}
    for r in rows:
        base = inductor.get((r["workload"], r["dtype"], r["size"]))
        if base and r.get("ms"):
            r["x_inductor"] = r["ms"] / base


def geomean(values) -> float:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(rows: list[dict], extra: dict) -> str:
    lines = [
        f"## minicomp bench on {extra['device']} (torch {extra['torch']})",
        "",
        f"command: `{extra['command']}`",
        "",
    ]
    if "copy_bandwidth_gbps" in extra:
        lines += [f"measured copy bandwidth: {extra['copy_bandwidth_gbps']:.0f} GB/s (read + write)", ""]
    lines += [
        "| workload | dtype | size | impl | check | ms | GB/s | x floor | x copy | x Inductor | peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ms = f"{r['ms']:.4f}" if "ms" in r else "-"
        gbps = f"{r['gbps']:.0f}" if "gbps" in r else "-"
        xf = f"{r['x_floor']:.3f}" if "x_floor" in r else "-"
        xc = f"{r['x_copy']:.3f}" if "x_copy" in r else "-"
        xi = f"{r['x_inductor']:.3f}" if "x_inductor" in r else "-"
        peak = f"{r['peak_mib']:.1f}" if "peak_mib" in r else "-"
        cells = [r["workload"], r["dtype"], r["size"], r["impl"], r["check"], ms, gbps, xf, xc, xi, peak]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    mine = [r for r in rows if r["impl"] == "minicomp" and "ms" in r]
    if mine:
        headline = [r for r in mine if r["size"] == max(x["size"] for x in mine if x["workload"] == r["workload"])]
        missed = [
            f"{r['workload']}/{r['dtype']} ({r['x_floor']:.3f}{_copy_note(r)})"
            for r in headline
            if r["x_floor"] > TARGET_X_FLOOR
        ]
        lines += [
            "",
            "### Targets",
            "",
            "- geometric mean of minicomp / Inductor time over all rows: "
            f"{geomean(r.get('x_inductor') for r in mine):.3f} (target <= 1.0)",
            f"- largest size of each workload within {TARGET_X_FLOOR}x of the floor: "
            + ("all" if not missed else "missed by " + ", ".join(missed)),
        ]
    if any("x_copy" in r for r in rows):
        lines += [
            "",
            "`x copy`: the time over that of a device copy moving as many bytes (half read, half written) at "
            "this size: what the launch and the last partial wave cost a kernel this large.",
        ]
    if "per_call_us" in extra:
        lines += ["", "### Per-call overhead (64 x 64 bias + ReLU, us per call)", ""]
        lines += [f"- {k}: {v:.1f}" for k, v in extra["per_call_us"].items()]
    if "compile_s" in extra:
        lines += ["", "### First call in a fresh process (s; imports inside the clock for both)", ""]
        lines += [f"- {k}: {v:.4f}" for k, v in extra["compile_s"].items()]
    for phase, parts in extra.get("compile_breakdown", {}).items():
        shown = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in parts.items())
        lines.append(f"- {phase}, where the compile went (s): {shown}")
    return "\n".join(lines)


def _copy_note(row: dict) -> str:
    """'; a copy of as many bytes: 1.090' for a row that has the copy's time."""
    if not row.get("copy_ms") or not row.get("floor_ms"):
        return ""
    return f"; a copy of as many bytes: {row['copy_ms'] / row['floor_ms']:.3f}"


def write(out: Path, rows: list[dict], extra: dict) -> None:
    (out / "results.json").write_text(json.dumps({"rows": rows, **extra}, indent=1))
    keys = sorted({k for r in rows for k in r})
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    (out / "table.md").write_text(markdown(rows, extra) + "\n")
    if any("ms" in r for r in rows):
        plot(out, rows)


def plot(out: Path, rows: list[dict]) -> None:
    """One PNG per workload and dtype: time vs size, a line per implementation plus the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for workload, dtype in sorted({(r["workload"], r["dtype"]) for r in rows}):
        mine = [r for r in rows if r["workload"] == workload and r["dtype"] == dtype and "ms" in r]
        if not mine:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for impl in ("eager", "inductor", "minicomp"):
            pts = sorted((r["size"], r["ms"]) for r in mine if r["impl"] == impl)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        floor = sorted({(r["size"], r["floor_ms"]) for r in mine})
        ax.plot(*zip(*floor), linestyle="--", color="black", label="memory floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (rows of 8192, or sequence length)")
        ax.set_ylabel("ms (median)")
        ax.set_title(f"{workload} {dtype}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{workload}_{dtype}.png", dpi=90)
        plt.close(fig)
