"""`minicomp` / `python -m minicomp`: demo, bench, explain, cache, zoo.

Every command takes `--help`, which prints its options and runs nothing.
"""

from __future__ import annotations

import argparse
import sys

COMMANDS = {
    "demo": "compile the seed workloads, check them against eager, show one generated module",
    "bench": "time minicomp against eager, Inductor and the memory floor",
    "explain": "show every stage of one example workload (graph, IR, fusion plan, source)",
    "cache": "`cache info` or `cache clear`: minicomp's on-disk cache",
    "zoo": "real architectures (tiny configs, transformers/timm/torchvision) through minicomp against eager",
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="minicomp",
        description="A small fusing compiler for PyTorch. `minicomp COMMAND --help` for a command's options.",
        epilog="commands:\n" + "\n".join(f"  {k:8} {v}" for k, v in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"minicomp {_version()}")
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help=", ".join(COMMANDS))
    args = parser.parse_args(argv[:1])
    rest = argv[1:]
    if args.command == "demo":
        from minicomp.tools.demo import main as demo

        return demo(rest)
    if args.command == "bench":
        from minicomp.bench.run import main as bench

        return bench(rest)
    if args.command == "explain":
        from minicomp.tools.explain import main as explain

        return explain(rest)
    if args.command == "zoo":
        from minicomp.tools.zoo import main as zoo

        return zoo(rest)
    return cache(rest)


def _version() -> str:
    from minicomp import __version__

    return __version__


def cache(argv) -> int:
    from minicomp.runtime import cache as disk

    parser = argparse.ArgumentParser(prog="minicomp cache", description=COMMANDS["cache"])
    parser.add_argument("action", choices=["info", "clear"], help="info: where and how much; clear: remove it all")
    action = parser.parse_args(argv).action
    try:
        if action == "info":
            print(disk.info())
        else:
            print(f"removed {disk.clear()} files from {disk.root()}")
    except OSError as err:  # a read-only or foreign directory: one line, not a traceback
        print(f"minicomp cache {action}: {err.strerror or err} ({err.filename or disk.root()})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
