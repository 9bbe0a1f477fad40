"""`minicomp zoo`: real architectures (tiny random configs) through minicomp, against eager.

Each model runs in its own process (zoo_run.py) with a time limit per mode, a private cache
directory (so compile times are cold) and MINICOMP_FALLBACK=warn (every whole-graph fallback is
recorded, not raised). Verdicts, per model and mode:

    right        every output, the loss, every gradient and buffer as close to float64 eager as float32 eager is
    wrong        some tensor further off (the worst one is named)
    crash        the compiled model raised (the error's first line, forward or backward, the generated module)
    timeout      no result within the time limit
    fallback     minicomp handed a whole graph back to eager for a reason the README does not document
    unsupported  a whole graph ran eagerly for a documented reason (tensor-value indexing inside a try block...)
    skipped      its source (timm, torchvision) does not import here
    error        eager itself failed (a harness problem)

Only `right` and `unsupported` pass; `skipped` is left out of the count.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

from minicomp.tools.zoo_models import FAST, MODELS
from minicomp.tools.zoo_run import MODES, PREFIX

PASSING = ("right", "unsupported")


def run_model(name: str, modes, timeout: float = 300, device: str = "cpu", threads: int = 1) -> list[dict]:
    """One model's modes in a child process, `timeout` seconds per mode; after a mode that times
    out or kills its process, the rest run in a new one."""
    out, todo = [], list(modes)
    while todo:
        results, current, timed_out, why = _child(name, todo, timeout, device, threads)
        for mode in list(todo):
            if mode in results:
                out.append(results[mode])
            elif mode == (current or todo[0]):
                verdict = "timeout" if timed_out else "crash"
                out.append(dict(model=name, mode=mode, verdict=verdict, detail=why))
            else:
                break
            todo.remove(mode)
    for record in out:
        record.setdefault("group", MODELS[name].group)
        record.setdefault("source", MODELS[name].source)
    return out


def _child(name, modes, timeout, device, threads):
    """(results by mode, the mode it was running when it stopped, timed out?, why it stopped)."""
    with tempfile.TemporaryDirectory(prefix="minicomp-zoo-") as cache:
        env = dict(os.environ, MINICOMP_CACHE_DIR=cache, MINICOMP_FALLBACK="warn", OMP_NUM_THREADS=str(threads))
        env["PYTHONPATH"] = os.pathsep.join(p for p in [_root(), env.get("PYTHONPATH", "")] if p)
        command = [sys.executable, "-m", "minicomp.tools.zoo_run", name, ",".join(modes), "--device", device]
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()
        stderr: list[str] = []
        readers = [
            threading.Thread(target=lambda: [lines.put(x) for x in child.stdout] + [lines.put(None)], daemon=True),
            threading.Thread(target=lambda: stderr.extend(child.stderr), daemon=True),
        ]
        for reader in readers:
            reader.start()
        results, current, deadline, timed_out = {}, None, time.monotonic() + timeout, False
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                child.kill()
                timed_out = True
                break
            if line is None:
                break
            if line.startswith(PREFIX):
                record = json.loads(line[len(PREFIX) :])
                if record.pop("kind") == "start":
                    current, deadline = record["mode"], time.monotonic() + timeout
                else:
                    results[record["mode"]], current = record, None
        child.wait()
        for reader in readers:
            reader.join(timeout=5)
    if timed_out:
        return results, current, True, f"no result in {timeout:g} s"
    last = next((x for x in reversed(stderr) if x.strip()), "").strip()
    return results, current, False, f"the process died ({child.returncode}): {last[:200]}"


def run(names, modes=MODES, jobs: int = 1, timeout: float = 300, device: str = "cpu", echo=print) -> list[dict]:
    """Every model in `names`, `jobs` at a time; results in the order of `names`."""
    from concurrent.futures import ThreadPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // max(jobs, 1))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_model, n, modes, timeout, device, threads) for n in names]
        results = []
        for future in futures:
            for record in future.result():
                echo(_line(record), flush=True)
                results.append(record)
    return results


def summary(results: list[dict]) -> str:
    counted = [r for r in results if r["verdict"] != "skipped"]
    count = lambda v: sum(r["verdict"] == v for r in counted)  # noqa: E731
    line = (
        f"{count('right')}/{len(counted)} right, {count('crash')} crashes, "
        f"{count('wrong')} wrong, {count('fallback')} whole-graph fallbacks"
    )
    extra = [f"{count(v)} {v}" for v in ("timeout", "error") if count(v)]
    extra += [f"{count('unsupported')} documented unsupported"] if count("unsupported") else []
    skipped = len(results) - len(counted)
    extra += [f"{skipped} skipped (source not importable)"] if skipped else []
    return line + (f" ({', '.join(extra)})" if extra else "")


def markdown(results: list[dict]) -> str:
    rows = ["| model | group | mode | verdict | compile s | fp32 vs fp64 | detail |", "|---|---|---|---|---|---|---|"]
    for r in results:
        seconds = f"{r['compile_s']:.1f}" if r.get("compile_s") is not None else ""
        cond = f"{r['fp32_vs_fp64']:.1e}" if r.get("fp32_vs_fp64") is not None else ""
        detail = (r.get("detail") or "").replace("|", "\\|")
        if r.get("graph"):
            detail += f" (in {r['graph']})"
        rows.append(f"| {r['model']} | {r['group']} | {r['mode']} | {r['verdict']} | {seconds} | {cond} | {detail} |")
    return "\n".join(rows) + "\n"


def _line(r: dict) -> str:
    seconds = f"{r['compile_s']:7.1f}s" if r.get("compile_s") is not None else " " * 8
    return f"{r['verdict']:11} {r['model']:16} {r['mode']:11} {seconds}  {r.get('detail') or ''}"


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse(argv):
    parser = argparse.ArgumentParser(
        prog="minicomp zoo",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", default=None, help="comma-separated names (default: the subset's)")
    parser.add_argument("--subset", choices=["fast", "full"], default="full", help=f"fast: {', '.join(FAST)}")
    parser.add_argument("--modes", default="all", help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="models run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per model and mode (default 300)")
    parser.add_argument("--device", default="cpu", help="cpu (Triton's interpreter) or cuda")
    parser.add_argument("--out", default=None, help="write the table: FILE.md (markdown) or FILE.json")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args(argv)
    args.modes = list(MODES) if args.modes == "all" else args.modes.split(",")
    names = args.models.split(",") if args.models else (FAST if args.subset == "fast" else list(MODELS))
    for bad in [m for m in args.modes if m not in MODES] + [n for n in names if n not in MODELS]:
        parser.error(
            f"unknown mode or model {bad!r}: `minicomp zoo --list` lists the models; modes: {', '.join(MODES)}"
        )
    args.names = names
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.list:
        for spec in MODELS.values():
            print(f"{spec.name:18} {spec.group:16} {spec.source}{'  (fast)' if spec.name in FAST else ''}")
        return 0
    started = time.monotonic()
    results = run(args.names, args.modes, args.jobs, args.timeout, args.device)
    line = summary(results)
    print(f"\n{markdown(results)}\n{line}  ({time.monotonic() - started:.0f} s)")
    if args.out:
        text = json.dumps(dict(summary=line, results=results), indent=1) if args.out.endswith(".json") else None
        with open(args.out, "w") as f:
            f.write(text or f"{line}\n\n{markdown(results)}")
        print(f"written to {args.out}")
    return 0 if all(r["verdict"] in (*PASSING, "skipped") for r in results) else 1
