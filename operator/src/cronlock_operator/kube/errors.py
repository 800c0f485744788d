"""The operator's one vocabulary of errors at the API edge, and what the work queue makes of
them: back off and retry (`Retry`), or stop for good (`Rejected`).

The API server's answers form one tree, as kopf's `_cogs/clients/errors.py`: `APIError`
with a class per status, each name meaning one status wherever the operator or `cronlock`
reads it (`NotFound` is a 404, `Expired` a 410), and `error_of` the one function that picks
the class. `kube/answers.api_error` reads the client's exceptions into it, for `kube/` and
for every command that talks to the API server itself (status, freeze, storeaccess,
selfcheck, uninstall): wherever they are caught, they are read through it, and past that
only the tree is raised (tests/unit/operator/test_api_errors.py fails every call site with
each status that matters and checks where it lands).

An answer a retry can fix is also a `Retry` (no answer, 403, 409, 422, 429, 5xx), so the
work queue backs off on it as on a lost race; the others stop the work where they are not
caught. What a reconcile decides is a value instead (runtime/workqueue.Result,
the executor's verdicts), as controller-runtime returns a `reconcile.Result` and an error.
The pure layers below kube/ cannot raise these (the operator's layers contract); nothing
here needs anything but the standard library.
"""

from __future__ import annotations

from typing import Final, Self


class Retry(Exception):
    """Work that should run again later, with backoff: a transient API error or a lost
    race. The one way a reconcile asks for backoff (`Result.requeue_after` is a look again,
    not an error)."""


class Rejected(Exception):
    """Refused for good (a CronJob patch the API server calls invalid, or an admission
    policy denies): retrying cannot help. The reconcile ends there; the runtime tells it
    once and does not retry."""


class KubeConfigError(Exception):
    """A kubeconfig that was asked for cannot be used (missing, unreadable, no such
    context): the user's to fix, so the message names it. The sidecar's `run` spells its
    own the same (cronlock_sidecar.transport.kubeconfig)."""


class NoConfiguration(Exception):
    """Neither a kubeconfig nor a pod's ServiceAccount to connect with."""


class APIError(Exception):
    """A request the API server did not answer with success, or did not answer at all.

    `status` is the HTTP status (0: no answer), `reason` its reason phrase (or, without an
    answer, what failed), `message` the API server's Status message ("" when none), and
    `causes` how many causes its Status names (a 422 that says what is invalid). This class
    itself is an answer no subclass names (400, 405, ...): neither retried nor final.
    """

    def __init__(
        self, text: str, *, status: int = 0, reason: str = "", message: str = "", causes: int = 0
    ) -> None:
        super().__init__(text)
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes

    def retold(self, text: str) -> Self:
        """The same answer in other words: a message that says what to do about it."""
        return type(self)(
            text,
            status=self.status,
            reason=self.reason,
            message=self.message,
            causes=self.causes,
        )


class Unreachable(APIError, Retry):
    """No answer (status 0): the connection failed or timed out, or what answered is no
    API server (a body that is not JSON)."""


class Unauthorized(APIError):
    """401: the credentials are not accepted (expired, revoked)."""


class Forbidden(APIError, Retry):
    """403: RBAC (retried: the grant may come in a moment) or an admission policy refuses.
    `final` tells the policy's denial, which no retry changes."""


class NotFound(APIError):
    """404: the object, or its whole namespace, is gone. Where no call expected it, the
    reconcile is done: the object's DELETED event tidies up."""


class Conflict(APIError, Retry):
    """409: the object changed since it was read, or exists already (a lost race)."""


class Expired(APIError):
    """410: the resourceVersion a watch or a list's next page asked for is too old: list
    again."""


class Invalid(APIError, Retry):
    """422: the API server did not accept the request's content. Retried: a bare one is a
    JSON patch's resourceVersion test failing (a lost race); one naming its causes says what
    is invalid, and `final` tells it."""


class TooManyRequests(APIError, Retry):
    """429: API priority and fairness asks to come back later."""


class ServerError(APIError, Retry):
    """5xx: the API server (or etcd, or a webhook it calls) failed."""


_BY_STATUS: Final[dict[int, type[APIError]]] = {
    0: Unreachable,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Expired,
    422: Invalid,
    429: TooManyRequests,
}


def error_of(
    status: int, text: str, *, reason: str = "", message: str = "", causes: int = 0
) -> APIError:
    """The tree's error for an answer of `status` (0: none), told as `text`: the one place
    a status becomes a class."""
    kind = _BY_STATUS.get(status) or (ServerError if 500 <= status < 600 else APIError)
    return kind(text, status=status, reason=reason, message=message, causes=causes)


def final(error: APIError) -> str:
    """The API server's message when its refusal is final ("" when a retry may help): a
    422 naming what is invalid, or a 403 of an admission policy (RBAC may be granted in a
    moment; a policy's denial stays)."""
    if isinstance(error, Invalid) and error.causes:
        return error.message
    if isinstance(error, Forbidden) and "ValidatingAdmissionPolicy" in error.message:
        return error.message
    return ""
