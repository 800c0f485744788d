"""`cronlock-operator`'s entry point: the operator's own packages are an extra
(`cronlock[operator]`: kopf, prometheus-client, uvloop), so `pip install cronlock` gives
the CLI alone. Without the extra this says what to install instead of a traceback."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

from cronlock_sidecar.contract import EXIT_CONFIG, VERSION

NEEDED = ("kopf", "prometheus_client", "uvloop")


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments == ["--version"]:
        print(f"cronlock-operator {VERSION}")
        return 0
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"cronlock-operator: {', '.join(missing)} not installed: the operator needs "
            "pip install 'cronlock[operator]' (the CLI, `cronlock`, needs only cronlock)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    from cronlock_operator import cli

    return cli.main(arguments)
