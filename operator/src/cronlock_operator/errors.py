"""The outcomes of work that are not results: retry later, refused for good, not ours.

At the bottom of the operator's layers: the pure deciders raise them, the runtime and the
Kubernetes adapter catch them, and none of them needs anything but the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping


class Retry(Exception):
    """Work that should run again later: a transient API error or a lost race."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class RequeueAfter(Retry):
    """Not an error: look at this again after `delay` seconds (someone may fix it meanwhile),
    as controller-runtime's `Result{RequeueAfter}`; never counted as a reconcile error."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message, delay)


class Rejected(Exception):
    """The API server refused what cronlock wrote as invalid: retrying cannot help."""


class NotOurs(Exception):
    """An object cronlock would write exists, and cronlock did not make it: it is left alone.

    The message names the object and what to do; the CronJob that needed it gets it as a
    Warning Event and stays as it was. `names` maps each such object's name to its message.
    """

    def __init__(self, message: str, names: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.names = dict(names or {})
