"""The error every annotation check raises, the duration parser they share, and `cut`."""

from __future__ import annotations

import json

from cronlock_sidecar.lock.durations import DURATION_FORMS, DurationError, parse_duration

# Characters of a message an Event or a log line carries: any CronJob author chooses
# what an InvalidConfig quotes, and a 200 KiB annotation must not cost 200 KiB a line.
MESSAGE_LIMIT = 1024
# Characters of a value an InvalidConfig quotes, so that its reason still fits in an Event.
QUOTE_LIMIT = 256


def cut(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` if it has at most `limit` characters, else its start and how long it was,
    in `limit` characters; the one cut of what Events and logs show."""
    if len(text) <= limit:
        return text
    note = f"… (cut from {len(text)} characters)"
    if limit <= len(note):
        return text[:limit]
    return text[: limit - len(note)] + note


class InvalidConfig(ValueError):
    """A `cronlock.io/*` annotation (or the CronJob it is on) that cronlock cannot honour."""

    def __init__(self, annotation: str, value: str | None, reason: str) -> None:
        self.annotation = annotation
        self.value = value
        self.reason = reason
        quoted = f": {cut(json.dumps(value), QUOTE_LIMIT)}" if value is not None else ""
        super().__init__(f"{annotation}{quoted} {reason}")


def duration_annotation(annotation: str, text: str) -> float:
    try:
        seconds = parse_duration(text)
    except DurationError:
        raise InvalidConfig(
            annotation, text, f"is not a duration; expected {DURATION_FORMS}"
        ) from None
    # Nanosecond precision, as in Go; avoids 0.1h being 360.00000000000006s.
    return round(seconds, 9)
