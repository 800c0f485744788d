"""The error every annotation check raises, and the duration parser they share."""

from __future__ import annotations

import json

from cronlock_sidecar.durations import DURATION_FORMS, DurationError, parse_duration


class InvalidConfig(ValueError):
    """A `cronlock.io/*` annotation (or the CronJob it is on) that cronlock cannot honour."""

    def __init__(self, annotation: str, value: str | None, reason: str) -> None:
        self.annotation = annotation
        self.value = value
        self.reason = reason
        shown = f"{annotation}: {json.dumps(value)}" if value is not None else annotation
        super().__init__(f"{shown} {reason}")


def duration_annotation(annotation: str, text: str) -> float:
    try:
        seconds = parse_duration(text)
    except DurationError:
        raise InvalidConfig(
            annotation, text, f"is not a duration; expected {DURATION_FORMS}"
        ) from None
    # Nanosecond precision, as in Go; avoids 0.1h being 360.00000000000006s.
    return round(seconds, 9)
