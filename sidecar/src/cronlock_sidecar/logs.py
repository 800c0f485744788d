"""One line per event on stderr, plain for people or JSON for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

PROGRAM = "cronlock-sidecar"


class JsonFormatter(logging.Formatter):
    """A JSON object per line: time, level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


def configure(log_format: str = "plain", level: str = "info") -> None:
    """Route the sidecar's loggers to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {PROGRAM} %(levelname)s %(message)s"))
    root = logging.getLogger("cronlock_sidecar")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def fatal(message: str) -> None:
    """A message for a run that cannot start, before or instead of logging."""
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)
