"""The logging formatters of the sidecar and the operator: one line per record, plain for
people or JSON for log pipelines, in the shapes of logline.py.

Kept apart from pod/logs.py (which routes the sidecar's loggers to stderr) so the operator
formats its lines the same way without importing the sidecar's pod; the gate never
imports this module (it writes its one line through logline.py, without logging).
"""

from __future__ import annotations

import json
import logging

from cronlock_sidecar import logline


class JsonFormatter(logging.Formatter):
    """A JSON object per line, one schema for the sidecar and the operator: timestamp,
    level, logger, message, then `object` (the Kubernetes object a line is about, where
    the operator's kopf knows it) and `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        document = logline.document(
            record.created, record.levelname, record.name, record.getMessage()
        )
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
        super().__init__()
        self.program = program

    def format(self, record: logging.LogRecord) -> str:
        line = logline.plain(record.created, record.levelname, record.getMessage(), self.program)
        reference = getattr(record, "k8s_ref", None)
        if isinstance(reference, dict) and reference.get("name"):
            where = "/".join(
                str(reference[key]) for key in ("namespace", "name") if reference.get(key)
            )
            line += f" [{where}]"
        # What logging.Formatter.format appends: the traceback, then the stack.
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line
