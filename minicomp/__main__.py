"""`minicomp` / `python -m minicomp`: demo, bench."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="minicomp", description="A small fusing compiler for PyTorch.")
    parser.add_argument("command", choices=["demo", "bench"], help="demo: run the examples; bench: benchmarks")
    args, rest = parser.parse_known_args(argv[:1])
    if args.command == "demo":
        from minicomp.demo import main as demo
        return demo(argv[1:])
    from minicomp.bench.run import main as bench
    return bench(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
