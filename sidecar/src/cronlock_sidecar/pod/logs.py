"""One line per event on stderr, plain for people or JSON for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

PROGRAM = "cronlock-sidecar"


class JsonFormatter(logging.Formatter):
    """A JSON object per line, one schema for the sidecar and the operator: timestamp,
    level, logger, message, then `object` (the Kubernetes object a line is about, where
    the operator's kopf knows it) and `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, object] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        reference = getattr(record, "k8s_ref", None)
        if isinstance(reference, dict) and reference:
            document["object"] = reference
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


class PlainFormatter(logging.Formatter):
    """`<time> <program> <LEVEL> <message>`, then ` [<namespace>/<name>]` when the line is
    about a Kubernetes object (the operator's kopf lines): the same for both programs."""

    def __init__(self, program: str) -> None:
        super().__init__(f"%(asctime)s {program} %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        reference = getattr(record, "k8s_ref", None)
        if isinstance(reference, dict) and reference.get("name"):
            where = "/".join(
                str(reference[key]) for key in ("namespace", "name") if reference.get(key)
            )
            line += f" [{where}]"
        return line


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
