"""`python -m tests.benchmarks [NAME|all] [ARGS...]`: run one benchmark (NAME), or all.

Each benchmark is a module with `main(argv) -> int` that starts the control plane it
needs, prints a table and writes JSON under `.testenv/bench/`. ARGS go to that module
(`python -m tests.benchmarks sidecar --help`); `all` runs every one with its defaults.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# Benchmark name -> module. Never name a module `operator`: it shadows the standard library.
MODULES = {
    "sidecar": "tests.benchmarks.sidecar",
    "operator": "tests.benchmarks.operator_scale",
    "load": "tests.benchmarks.load",
    "runstart": "tests.benchmarks.runstart",
    "queuestart": "tests.benchmarks.queuestart",
    "renewals": "tests.benchmarks.renewals",
    "fleet": "tests.benchmarks.fleet",
    "permits": "tests.benchmarks.permits",
}
USAGE = f"usage: python -m tests.benchmarks [{'|'.join(MODULES)}|all] [ARGS...]"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    name = args.pop(0) if args else "all"
    if name == "all":
        if args:
            print(f"{USAGE}\nall: takes no ARGS; run one benchmark to pass them", file=sys.stderr)
            return 2
        failed = [each for each in MODULES if _run(each, []) != 0]
        return 1 if failed else 0
    if name not in MODULES:
        print(f"{USAGE}\nunknown benchmark {name!r}", file=sys.stderr)
        return 2
    return _run(name, args)


def _run(name: str, args: list[str]) -> int:
    print(f"== {name} benchmark ==", flush=True)
    module = importlib.import_module(MODULES[name])
    code: int = module.main(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
