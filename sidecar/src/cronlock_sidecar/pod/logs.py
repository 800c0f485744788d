"""One line per event on stderr, plain for people or JSON for log pipelines (logformat.py)."""

from __future__ import annotations

import logging
import sys

from cronlock_sidecar.logformat import JsonFormatter, PlainFormatter
from cronlock_sidecar.logline import PROGRAM


def configure(log_format: str = "plain", level: str = "info") -> None:
    """Route the sidecar's loggers to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(PlainFormatter(PROGRAM))
    root = logging.getLogger("cronlock_sidecar")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def fatal(message: str) -> None:
    """A message for a run that cannot start, before or instead of logging."""
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)
