"""Every call the operator and `cronlock` make to the API server, failed with each status
that matters (no answer, 403, 404, 409, 410, 422, 429, 500, 503), lands on the one error
tree of kube/errors.py: the class its status names, a Retry exactly when a retry can fix
it, the client's exception chained as the cause; or on the value the call site makes of it
(a 404 read is None, a 409 leader write False, ...).

The failures come through the real client (`kubernetes.client.ApiClient` and its REST
layer): only its connection pool is replaced, by one that answers each request with the
status asked for, or times out. The call sites are listed one by one below; a new method
on `Kube`, `HolderRbac` or `LeaderLeases` fails `test_every_call_site_is_listed`.
"""

from __future__ import annotations

import inspect
import io
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes
import pytest
import urllib3

from cronlock_operator import selfcheck, storeaccess, uninstall
from cronlock_operator.freeze import commands as freezing
from cronlock_operator.kube import client as kube_client
from cronlock_operator.kube.answers import api_error
from cronlock_operator.kube.cache import ObjectCache
from cronlock_operator.kube.errors import (
    APIError,
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    NotFound,
    Rejected,
    Retry,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unreachable,
    error_of,
    final,
)
from cronlock_operator.kube.leaderlease import LeaderLeases
from cronlock_operator.kube.rbac_writes import HolderRbac
from cronlock_operator.kube.writes import Kube
from cronlock_operator.status import api as status_api
from cronlock_sidecar import contract

STATUSES = (0, 403, 404, 409, 410, 422, 429, 500, 503)
CLASSES: Mapping[int, type[APIError]] = {
    0: Unreachable,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Expired,
    422: Invalid,
    429: TooManyRequests,
    500: ServerError,
    503: ServerError,
}
# What a retry can fix: no answer, RBAC not granted yet, a lost race, a busy or failing
# server. A 404 and a 410 are not (the object is gone; list again).
RETRIED = {0, 403, 409, 422, 429, 500, 503}
SERVER = "https://apiserver.test"
NS = "team-a"
LEASE = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {"name": "cronlock-report", "namespace": NS, "resourceVersion": "5"},
    "spec": {},
}
CRONJOB = {
    "apiVersion": "batch/v1",
    "kind": "CronJob",
    "metadata": {"name": "report", "namespace": NS, "uid": "u-report"},
}
ROLE = {"metadata": {"name": "cronlock-holder-runner", "namespace": NS}}
BINDING = {
    **ROLE,
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"},
}
BODIES = {"Role": ROLE, "RoleBinding": BINDING}


def status_body(code: int, message: str = "", causes: int = 0) -> bytes:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message or f"the API server answered {code}",
        "code": code,
    }
    if causes:
        status["details"] = {"causes": [{"field": f"spec.f{n}"} for n in range(causes)]}
    return json.dumps(status).encode()


class Answers:
    """The client's connection pool: each request answered `status` (0: a read timeout),
    except methods in `ok`, answered 200 with `ok_body`."""

    def __init__(
        self,
        status: int,
        *,
        body: bytes | None = None,
        ok: frozenset[str] = frozenset(),
        ok_body: Mapping[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.body = body if body is not None else status_body(status)
        self.ok = ok
        self.ok_body = json.dumps(ok_body or {}).encode()
        self.requests: list[tuple[str, str]] = []

    def request(self, method: str, url: str, **_: Any) -> urllib3.HTTPResponse:
        self.requests.append((method, url))
        if method in self.ok:
            return answer(200, self.ok_body)
        if self.status == 0:
            raise urllib3.exceptions.ReadTimeoutError(None, url, "Read timed out.")  # type: ignore[arg-type]
        return answer(self.status, self.body)

    def clear(self) -> None:
        pass


def answer(status: int, body: bytes) -> urllib3.HTTPResponse:
    return urllib3.HTTPResponse(
        body=io.BytesIO(body),
        status=status,
        reason="Because",
        headers={"Content-Type": "application/json"},
        preload_content=False,
    )


def api_client(answers: Answers) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = SERVER
    api = kubernetes.client.ApiClient(configuration)
    api.rest_client.pool_manager = answers
    return api


@dataclass(frozen=True)
class Returns:
    """The call site makes a value of this failure instead of raising."""

    value: object


Outcome = type[Exception] | Returns
Call = Callable[[kubernetes.client.ApiClient], object]


def kube(call: Callable[[Kube], object]) -> Call:
    return lambda api: call(Kube(api))


def rbac(call: Callable[[HolderRbac], object]) -> Call:
    return lambda api: call(HolderRbac(kubernetes.client.RbacAuthorizationV1Api(api)))


def leader(call: Callable[[LeaderLeases], object]) -> Call:
    return lambda api: call(LeaderLeases(api))


def cluster(api: kubernetes.client.ApiClient) -> status_api.Cluster:
    return status_api.Cluster(api, NS, SERVER, request_timeout=1.0)


GONE_IS_NONE = {404: Returns(None)}
# Each call site the operator makes (kube/writes.py's Kube, kube/rbac_writes.py's
# HolderRbac, kube/leaderlease.py's LeaderLeases) and `cronlock status` (status/api.py),
# with what it makes of a failure instead of raising the status's class.
CALL_SITES: dict[str, tuple[Call, Mapping[int, Outcome]]] = {
    "Kube.patch_cronjob": (kube(lambda k: k.patch_cronjob(NS, "report", [])), GONE_IS_NONE),
    "Kube.annotate_cronjob": (
        kube(lambda k: k.annotate_cronjob(NS, "report", {"a": "b"})),
        GONE_IS_NONE,
    ),
    "Kube.list_cronjobs": (kube(lambda k: k.list_cronjobs([NS], ObjectCache())), {}),
    "Kube.list_cronjobs, all namespaces": (
        kube(lambda k: k.list_cronjobs([], ObjectCache())),
        {},
    ),
    "Kube.list_leases": (kube(lambda k: list(k.list_leases([NS]))), {}),
    "Kube.labelled_namespaces": (kube(lambda k: k.labelled_namespaces()), {}),
    "Kube.read_cronjob": (kube(lambda k: k.read_cronjob(NS, "report")), GONE_IS_NONE),
    "Kube.read_deployment": (kube(lambda k: k.read_deployment(NS, "cronlock")), {}),
    # A 409 reads the Lease that exists: that read fails alike.
    "Kube.create_lease": (kube(lambda k: k.create_lease(NS, LEASE)), {}),
    # A Lease gone under a merge is a lost race, not the CronJob gone.
    "Kube.merge_lease": (kube(lambda k: k.merge_lease(NS, "cronlock-report", {})), {404: Retry}),
    "Kube.read_pod": (kube(lambda k: k.read_pod(NS, "report-1-x")), GONE_IS_NONE),
    "Kube.read_job": (kube(lambda k: k.read_job(NS, "report-1")), GONE_IS_NONE),
    "Kube.read_lease": (kube(lambda k: k.read_lease(NS, "cronlock-report")), GONE_IS_NONE),
    "Kube.patch_lease": (
        kube(lambda k: k.patch_lease(NS, "cronlock-report", [])),
        {404: Returns(False), 409: Returns(False), 422: Returns(False)},
    ),
    "Kube.delete_lease": (kube(lambda k: k.delete_lease(NS, "cronlock-report", "5")), GONE_IS_NONE),
    "Kube.mark_job": (kube(lambda k: k.mark_job(NS, "report-1", "a", "b")), {404: Returns(False)}),
    "Kube.delete_job": (
        kube(lambda k: k.delete_job(NS, "report-1", "5")),
        {404: Returns(False), 409: Returns(False)},
    ),
    "Kube.resume_job": (
        kube(lambda k: k.resume_job(NS, "report-1")),
        {404: Returns(False), 409: Returns(False), 422: Returns(False)},
    ),
    "Kube.post_event": (kube(lambda k: k.post_event(CRONJOB, "Injected", "hi")), GONE_IS_NONE),
    **{
        f"HolderRbac.{verb} {kind}": (rbac(call), outcomes)
        for kind in ("Role", "RoleBinding")
        for verb, call, outcomes in (
            ("read", lambda h, kind=kind: h.read(kind, NS, "x"), GONE_IS_NONE),
            ("create", lambda h, kind=kind: h.create(kind, NS, BODIES[kind]), {}),
            ("replace", lambda h, kind=kind: h.replace(kind, NS, BODIES[kind]), {}),
            ("labelled", lambda h, kind=kind: h.labelled(kind, NS), {}),
            ("delete", lambda h, kind=kind: h.delete(kind, NS, "x"), GONE_IS_NONE),
        )
    },
    "LeaderLeases.read": (leader(lambda e: e.read(NS, "cronlock-leader")), GONE_IS_NONE),
    "LeaderLeases.create": (leader(lambda e: e.create(NS, LEASE)), {409: Returns(False)}),
    "LeaderLeases.replace": (
        leader(lambda e: e.replace(NS, "cronlock-leader", LEASE)),
        {409: Returns(False)},
    ),
    "status Collection.list cronjobs": (
        lambda api: status_api.Collection(cluster(api), "cronjobs", NS, "").list(),
        {},
    ),
    "status Collection.list leases, all namespaces": (
        lambda api: status_api.Collection(
            cluster(api), "leases", None, status_api.LEASE_SELECTOR
        ).list(),
        {},
    ),
    "status Collection.watch": (
        lambda api: status_api.Collection(cluster(api), "leases", NS, "").watch("5"),
        {},
    ),
    # Many who may read CronJobs may not read namespaces: then none are known labelled.
    "status labelled_namespaces": (
        lambda api: status_api.labelled_namespaces(cluster(api), NS),
        {403: Returns(None)},
    ),
    "uninstall: list what cronlock made": (
        lambda api: uninstall._delete_ours(Kube(api), [NS], frozenset()),
        {},
    ),
}


def expected(site: str, status: int) -> Outcome:
    return CALL_SITES[site][1].get(status, CLASSES[status])


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("site", CALL_SITES)
def test_each_call_sites_failure_lands_on_its_class_in_the_tree(site: str, status: int) -> None:
    answers = Answers(status)
    call, _ = CALL_SITES[site]
    outcome = expected(site, status)
    if isinstance(outcome, Returns):
        assert call(api_client(answers)) == outcome.value
        assert answers.requests, "the call reached the API server"
        return
    with pytest.raises((APIError, Retry)) as raised:
        call(api_client(answers))
    error = raised.value
    assert type(error) is outcome, f"{site}: {status} became {type(error).__name__}: {error}"
    if isinstance(error, APIError):
        assert error.status == status
        assert isinstance(error, Retry) == (status in RETRIED)
    # Past the edge the client's exceptions are only ever the cause, of the tree's error.
    cause: BaseException | None = error if isinstance(error, APIError) else error.__cause__
    assert isinstance(cause, APIError)
    while isinstance(cause, APIError):
        cause = cause.__cause__
    assert isinstance(cause, kubernetes.client.ApiException | urllib3.exceptions.HTTPError)


@pytest.mark.parametrize("status", [code for code in STATUSES if code])
def test_a_failure_inside_a_watch_stream_lands_on_the_same_class(status: int) -> None:
    """A watch answers 200, then may send a Status as an ERROR event: read as an answer."""
    event = {"type": "ERROR", "object": json.loads(status_body(status))}
    answers = Answers(200, body=json.dumps(event).encode() + b"\n")
    events = status_api.Collection(cluster(api_client(answers)), "leases", NS, "").watch("5")
    with pytest.raises(CLASSES[status]) as raised:
        list(events)
    assert raised.value.status == status
    assert f"the API server answered {status}" in str(raised.value)


# What the commands that talk to the API server themselves make of the tree's classes:
# each says it in its own words and exit code, and keeps the tree's error as the context.
def frozen_lease() -> dict[str, Any]:
    notes = freezing.Freeze(datetime.now(UTC) + timedelta(hours=1), "jane", "upgrade")
    return {**LEASE, "metadata": {**LEASE["metadata"], "annotations": notes.annotations()}}


COMMANDS: dict[str, tuple[Call, frozenset[str], Mapping[str, Any] | None]] = {
    "freeze: who is calling": (
        lambda api: freezing.freeze(api, NS, "report", duration="1h", until=None, reason="x"),
        frozenset(),
        None,
    ),
    "unfreeze: read the Lease": (
        lambda api: freezing.unfreeze(api, NS, "report"),
        frozenset(),
        None,
    ),
    "unfreeze: patch the Lease": (
        lambda api: freezing.unfreeze(api, NS, "report"),
        frozenset({"GET"}),
        frozen_lease(),
    ),
    "storeaccess: read the store's Secret": (
        lambda api: storeaccess.store_url(api, NS, "store"),
        frozenset(),
        None,
    ),
}


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("site", COMMANDS)
def test_the_commands_tell_each_class_in_their_own_words(site: str, status: int) -> None:
    call, ok, ok_body = COMMANDS[site]
    answers = Answers(status, ok=ok, ok_body=ok_body)
    with pytest.raises((freezing.FreezeError, storeaccess.StoreAccessError)) as raised:
        call(api_client(answers))
    told = raised.value.__context__
    assert type(told) is CLASSES[status], f"{site}: {status} became {told!r}"
    if isinstance(raised.value, freezing.FreezeError):
        lease_missing = status == 404 and site.startswith("unfreeze")
        assert raised.value.code == (
            freezing.EXIT_NOT_FOUND if lease_missing else freezing.EXIT_UNAVAILABLE
        )
    else:
        said = {403: "you may not read Secret", 404: "there is no Secret"}
        assert said.get(status, f"reading Secret {NS}/store") in str(raised.value)


@pytest.mark.parametrize("status", STATUSES)
def test_the_metrics_self_check_logs_the_trees_error_and_exits_69(
    status: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    answers = Answers(status)
    monkeypatch.setattr(kube_client, "api_client", lambda: api_client(answers))
    with caplog.at_level(logging.ERROR, logger=selfcheck.__name__):
        assert selfcheck.check_service(NS, "cronlock-metrics", 0.0) == contract.EXIT_UNAVAILABLE
    told = caplog.records[-1].args
    assert isinstance(told, tuple)
    assert type(told[0]) is CLASSES[status]
    assert (
        caplog.records[-1]
        .getMessage()
        .startswith(f"cannot list the EndpointSlices of Service {NS}/cronlock-metrics: ")
    )


@pytest.mark.parametrize("status", STATUSES)
def test_uninstall_tells_what_it_could_not_post_and_goes_on(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    answers = Answers(status)
    with caplog.at_level(logging.WARNING, logger=uninstall.__name__):
        uninstall._tell(Kube(api_client(answers)), CRONJOB, "its record is unreadable")
    if status == 404:  # its namespace is gone: nobody to tell
        assert not caplog.records
    else:
        assert caplog.records[-1].getMessage().startswith("uninstall: no NotReverted Event")


def test_every_call_site_is_listed() -> None:
    """A new method that calls the API server is listed above, or this fails."""
    listed = {site.split(" ")[0] for site in CALL_SITES}
    for owner in (Kube, HolderRbac, LeaderLeases):
        for name, _ in inspect.getmembers(owner, inspect.isfunction):
            if not name.startswith("_"):
                assert f"{owner.__name__}.{name}" in listed, f"{owner.__name__}.{name}"


def test_a_patch_the_api_server_refuses_for_good_is_rejected() -> None:
    """A CronJob patch that is invalid as such (a 422 naming causes), or that an admission
    policy denies, is Rejected: the reconcile ends there and is not retried. A bare 422
    (the patch's resourceVersion test failing) and an RBAC 403 stay retried."""
    policy = (
        'cronjobs.batch "report" is forbidden: ValidatingAdmissionPolicy '
        "'cronlock-operator-scope' with binding 'cronlock-operator-scope' denied request: "
        "cronlock's containers (cronlock, cronlock-gate) run only the configured sidecar image"
    )
    invalid = 'CronJob.batch "report" is invalid: spec.jobTemplate.spec.template: restartPolicy'
    for status, message, causes in ((403, policy, 0), (422, invalid, 1)):
        answers = Answers(status, body=status_body(status, message, causes))
        with pytest.raises(Rejected, match=r"is (forbidden|invalid)") as raised:
            Kube(api_client(answers)).patch_cronjob(NS, "report", [])
        assert str(raised.value) == message
        assert type(raised.value.__cause__) is CLASSES[status]
    rbac_refusal = 'cronjobs.batch "report" is forbidden: User "x" cannot patch resource'
    for status, message in ((403, rbac_refusal), (422, "")):
        answers = Answers(status, body=status_body(status, message))
        with pytest.raises(CLASSES[status]):
            Kube(api_client(answers)).patch_cronjob(NS, "report", [])


def test_final_tells_only_a_policys_denial_and_a_422_naming_causes() -> None:
    def told(status: int, message: str, causes: int = 0) -> str:
        return final(error_of(status, "x", message=message, causes=causes))

    assert told(403, "... ValidatingAdmissionPolicy 'p' denied request") != ""
    assert told(403, 'User "x" cannot patch resource "cronjobs"') == ""
    assert told(409, "ValidatingAdmissionPolicy") == ""
    assert told(422, "is invalid", causes=2) == "is invalid"
    assert told(422, "the server rejected our request") == ""


def test_an_event_in_a_namespace_being_deleted_is_given_up_not_retried() -> None:
    terminating = (
        'events "report.1" is forbidden: unable to create new content in namespace team-a '
        "because it is being terminated"
    )
    answers = Answers(403, body=status_body(403, terminating))
    assert Kube(api_client(answers)).post_event(CRONJOB, "Injected", "hi") is None


def test_a_namespace_that_refuses_the_operator_says_which_rolebinding_is_missing() -> None:
    with pytest.raises(Forbidden, match="this operator has no RoleBinding in namespace team-a"):
        Kube(api_client(Answers(403))).list_cronjobs([NS], ObjectCache())


@pytest.mark.parametrize(
    ("status", "kind"),
    [(401, Unauthorized), (400, APIError), (501, ServerError), (418, APIError)],
)
def test_other_statuses_are_named_by_class_and_none_is_retried_but_a_server_error(
    status: int, kind: type[APIError]
) -> None:
    error = api_error("get lease team-a/x", kubernetes.client.ApiException(status=status))
    assert type(error) is kind
    assert isinstance(error, Retry) == (kind is ServerError)


def test_a_connection_that_fails_names_what_failed_not_urllib3s_wrapping() -> None:
    refused = urllib3.exceptions.NewConnectionError(None, "Connection refused")  # type: ignore[arg-type]
    wrapped = urllib3.exceptions.MaxRetryError(None, "/apis", reason=refused)  # type: ignore[arg-type]
    error = api_error("get lease team-a/x", wrapped)
    assert type(error) is Unreachable
    assert str(error).startswith("get lease team-a/x: ")
    assert str(error).endswith("Connection refused")
    assert "Max retries" not in str(error)
