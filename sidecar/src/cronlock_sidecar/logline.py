"""One log line, plain or JSON, without the logging module.

The loggers of the sidecar and the operator format through these (logformat.py), and
the gate writes its one line with them directly: importing `logging` would cost the
gate's start more than a tenth of its time, and the gate is on every guarded run's way
to its work (docs/PERFORMANCE.md). One implementation, so the two cannot drift apart.
"""

from __future__ import annotations

import time

PROGRAM = "cronlock-sidecar"
# The levels a line may have, lowest first; the threshold drops the lines below it.
LEVELS = ("debug", "info", "warning", "error", "critical")


def plain(created: float, level: str, message: str, program: str = PROGRAM) -> str:
    """`<local time>,<ms> <program> <LEVEL> <message>`: logging's default asctime."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
    millis = int((created - int(created)) * 1000)
    return f"{stamp},{millis:03d} {program} {level.upper()} {message}"


def document(created: float, level: str, logger: str, message: str) -> dict[str, object]:
    """The JSON line's fields, in order: timestamp (UTC, ms), level, logger, message."""
    # Only a JSON line needs datetime (with the `operator` and `math` it imports): the
    # gate's plain line goes without.
    from datetime import UTC, datetime

    return {
        "timestamp": datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds"),
        "level": level.lower(),
        "logger": logger,
        "message": message,
    }


def line(log_format: str, created: float, level: str, logger: str, message: str) -> str:
    """The whole line in `log_format` (plain or json)."""
    if log_format == "json":
        import json  # only a JSON line needs it

        return json.dumps(document(created, level, logger, message))
    return plain(created, level, message)


def shown(level: str, threshold: str) -> bool:
    """Whether a line at `level` passes a `--log-level threshold`."""
    return LEVELS.index(level.lower()) >= LEVELS.index(threshold.lower())
