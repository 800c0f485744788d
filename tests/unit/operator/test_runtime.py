"""The operator's runtime between reconciles: conflicts and refusals, without an API server."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cronlock_operator.injection.build import is_injected
from cronlock_operator.kube.errors import Rejected, Retry
from cronlock_operator.reconcile.keys import CronJobKey, LeaseKey, RbacKey
from cronlock_operator.runtime import metrics
from cronlock_operator.runtime.cronjobs import CONFLICT_RECHECK
from cronlock_operator.runtime.reconciler import Reconciler
from cronlock_operator.runtime.workqueue import DONE, Result, WorkQueue
from tests.support import gen
from tests.support.cronjobs import SETTINGS, server_defaults
from tests.support.fakekube import FakeKube
from tests.support.leases import make_lease
from tests.support.metrics import cronjob_states
from tests.support.reconciling import reconcile_cronjob

ENABLED = "cronlock.io/enabled"

FOREIGN_LEASE = {
    "metadata": {"name": "cronlock-report", "namespace": "team-a", "resourceVersion": "1"}
}


class Kube(FakeKube):
    """The in-memory API server, with the refusals these tests need at hand."""

    def foreign_lease(self, present: bool = True) -> None:
        """A Lease `cronlock-report` cronlock did not make, unseen by the operator's cache."""
        if present:
            self.leases[("team-a", "cronlock-report")] = copy.deepcopy(FOREIGN_LEASE)
        else:
            del self.leases[("team-a", "cronlock-report")]

    def foreign_role(self, namespace: str, account: str = "default") -> None:
        name = f"cronlock-holder-{account}"
        self.rbac.objects[("Role", namespace, name)] = {"metadata": {"name": name}}

    @property
    def patches(self) -> int:
        return len(self.called("patch_cronjob"))

    def rbac_syncs(self) -> list[str]:
        """The namespace of each holder RBAC write that got as far as its stale ones."""
        return [namespace for kind, namespace in self.rbac.called("labelled") if kind == "Role"]


def setup(**account: str) -> tuple[Reconciler, Kube]:
    kube = Kube()
    reconciler = Reconciler(kube=kube, settings=SETTINGS)
    for name, service_account in {"report": "default", **account}.items():
        body = server_defaults(gen.cronjob(name, gen.service_account(service_account)))
        body["metadata"]["uid"] = f"uid-{name}"
        kube.cronjobs[("team-a", name)] = copy.deepcopy(body)
        reconciler.on_cronjob("ADDED", body)
    return reconciler, kube


def reconcile(reconciler: Reconciler, namespace: str, name: str) -> Result:
    return reconcile_cronjob(reconciler, namespace, name)


RECHECK = Result(requeue_after=CONFLICT_RECHECK)


def counted_errors() -> float:
    sample = metrics.registry.get_sample_value(
        "cronlock_reconcile_errors_total", {"namespace": "team-a", "kind": CronJobKey.kind}
    )
    return sample or 0.0


def reasons(kube: FakeKube) -> list[str]:
    return kube.reasons()


def test_a_foreign_lease_refuses_the_cronjob_once_and_keeps_it_out_of_the_roles() -> None:
    reconciler, kube = setup(export="default")
    kube.foreign_lease()
    for _ in range(2):  # the periodic recheck finds the same conflict
        assert reconcile(reconciler, "team-a", "report") == RECHECK
    assert reasons(kube) == ["Conflict"]
    assert kube.patches == 0
    assert reconciler.guarding.book.guard(("team-a", "report")) is None
    kube.foreign_lease(present=False)
    reconcile(reconciler, "team-a", "export")
    # The refused CronJob's Lease is granted to nobody, not even as a pending guard.
    granted = reconciler.holder_rbac.synced["team-a"]
    assert {guard.lease for guard in granted} == {"cronlock-export"}

    reconcile(reconciler, "team-a", "report")  # the name was freed meanwhile
    assert kube.patches == 2
    assert ("team-a", "report") not in reconciler.guarding.refused()


def test_a_change_in_its_namespace_looks_again_at_once_at_a_cronjob_in_conflict() -> None:
    """Consent given, a lock renamed, a CronJob deleted: a conflict may be settled by any
    CronJob of the namespace, so the refused ones are queued then, not CONFLICT_RECHECK on."""
    reconciler, kube = setup(export="default")
    kube.foreign_lease()
    assert reconcile(reconciler, "team-a", "report") == RECHECK
    refused = CronJobKey("team-a", "report")
    reconciler.queue = WorkQueue(reconciler.queue.work)  # what is queued from here on
    elsewhere = server_defaults(gen.cronjob("export", gen.in_namespace("team-b")))
    reconciler.on_cronjob("ADDED", elsewhere)
    assert not reconciler.queue.waiting(refused)
    body = copy.deepcopy(kube.cronjobs[("team-a", "export")])
    body["metadata"]["annotations"]["cronlock.io/share-lock-with"] = "report"
    body["metadata"]["resourceVersion"] = "99"
    reconciler.on_cronjob("MODIFIED", body)
    assert reconciler.queue.waiting(refused)
    reconciler.queue = WorkQueue(reconciler.queue.work)
    reconciler.on_cronjob("DELETED", body)
    assert reconciler.queue.waiting(refused)


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}}


def test_a_labelled_namespace_guards_its_cronjobs_but_the_one_that_opts_out() -> None:
    """Label added: every CronJob of the namespace is queued and injected but one annotated
    "false" and one whose pods run as `default` (declined: one Warning, no holder Role);
    label removed (the selector's DELETED): queued again and reverted."""
    kube = Kube()
    reconciler = Reconciler(kube=kube, settings=SETTINGS)
    accounts = {"report": "reports", "export": "default", "audit": "reports"}
    for name, notes in (("report", {}), ("export", {}), ("audit", {ENABLED: "false"})):
        made = gen.cronjob(name, gen.with_annotations(notes), gen.service_account(accounts[name]))
        body = server_defaults(made)
        body["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
        kube.cronjobs[("team-a", name)] = copy.deepcopy(body)
        reconciler.on_cronjob("ADDED", body)
    elsewhere = server_defaults(
        gen.cronjob("other", gen.in_namespace("team-b"), gen.not_opted_in())
    )
    reconciler.on_cronjob("ADDED", elsewhere)
    reconciler.queue = WorkQueue(reconciler.queue.work)  # what is queued from here on

    def decide_all() -> dict[str, bool]:
        for name in ("report", "export", "audit"):
            assert reconciler.queue.waiting(CronJobKey("team-a", name))
            reconcile(reconciler, "team-a", name)
            reconciler.on_cronjob("MODIFIED", copy.deepcopy(kube.cronjobs[("team-a", name)]))
        assert not reconciler.queue.waiting(CronJobKey("team-b", "other"))
        reconciler.queue = WorkQueue(reconciler.queue.work)
        return {
            name: is_injected(kube.cronjobs[("team-a", name)])
            for name in ("report", "export", "audit")
        }

    reconciler.on_namespace("ADDED", namespace("team-a", {ENABLED: "true"}))
    assert decide_all() == {"report": True, "export": False, "audit": False}
    declined = [event for event in kube.events if event[1] == "NotGuarded"]
    assert [(name, warning) for name, _, _, warning in declined] == [("export", True)]
    roles = {
        name: body["rules"][0]["resourceNames"]
        for (kind, _, name), body in kube.rbac.objects.items()
        if kind == "Role"
    }
    assert roles == {"cronlock-holder-reports": ["cronlock-report"]}, "nothing for default"
    # Guarded, then moved onto `default` (or guarded by an older operator): reverted as
    # written, its grant taken back.
    moved = kube.cronjobs[("team-a", "report")]
    moved["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"] = "default"
    moved["metadata"]["resourceVersion"] = "moved"
    reconciler.on_cronjob("MODIFIED", copy.deepcopy(moved))
    reconcile(reconciler, "team-a", "report")
    reconciler.on_cronjob("MODIFIED", copy.deepcopy(kube.cronjobs[("team-a", "report")]))
    assert not is_injected(kube.cronjobs[("team-a", "report")])
    assert [kind for kind, _, _ in kube.rbac.objects] == [], "the grant taken back"
    moved = kube.cronjobs[("team-a", "report")]
    moved["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"] = "reports"
    moved["metadata"]["resourceVersion"] = "back"
    reconciler.on_cronjob("MODIFIED", copy.deepcopy(moved))
    reconcile(reconciler, "team-a", "report")
    reconciler.on_cronjob("MODIFIED", copy.deepcopy(kube.cronjobs[("team-a", "report")]))
    assert is_injected(kube.cronjobs[("team-a", "report")])
    reconciler.queue = WorkQueue(reconciler.queue.work)
    # The same label seen again (a resync, another label changed): nothing queued.
    reconciler.on_namespace("MODIFIED", namespace("team-a", {ENABLED: "true", "team": "a"}))
    assert not reconciler.queue.waiting(CronJobKey("team-a", "report"))
    reconciler.on_namespace("DELETED", namespace("team-a", {ENABLED: "no"}))
    assert decide_all() == {"report": False, "export": False, "audit": False}
    assert "Reverted" in reasons(kube)


def test_the_labelled_namespaces_are_read_before_any_cronjob_and_only_watched_ones() -> None:
    kube = Kube()
    kube.labelled = {"team-a", "team-c"}
    reconciler = Reconciler(kube=kube, settings=SETTINGS, watched_namespaces=frozenset({"team-a"}))
    reconciler.load_labelled_namespaces()
    assert reconciler.readings.labelled_namespaces() == {"team-a"}
    reconciler.on_namespace("ADDED", namespace("team-b", {ENABLED: "true"}))
    assert reconciler.readings.labelled_namespaces() == {"team-a"}


def states() -> dict[str, float]:
    return cronjob_states()


def test_cronjobs_are_counted_by_state_guarded_invalid_or_in_conflict() -> None:
    """cronlock_cronjobs{state}: an opted-in CronJob that is not guarded as asked shows."""
    reconciler, kube = setup(export="default", audit="default")
    for name in ("report", "export", "audit"):
        reconcile(reconciler, "team-a", name)
    assert states() == {"guarded": 3, "invalid": 0, "conflict": 0}
    # A bad setting on an injected CronJob: it keeps its last injection, but not as asked.
    body = copy.deepcopy(kube.cronjobs[("team-a", "audit")])
    body["metadata"]["annotations"]["cronlock.io/ttl"] = "soon"
    body["metadata"]["resourceVersion"] = "99"
    kube.cronjobs[("team-a", "audit")] = copy.deepcopy(body)
    reconciler.on_cronjob("MODIFIED", body)
    reconcile(reconciler, "team-a", "audit")
    assert states() == {"guarded": 2, "invalid": 1, "conflict": 0}
    assert metrics.registry.get_sample_value("cronlock_guarded_cronjobs") == 3
    # Deleted CronJobs leave every state.
    for name in ("audit", "export"):
        del kube.cronjobs[("team-a", name)]
        reconciler.on_cronjob("DELETED", reconciler.cronjobs.get(("team-a", name)))
        reconcile(reconciler, "team-a", name)
    assert states() == {"guarded": 1, "invalid": 0, "conflict": 0}


def test_a_conflict_is_counted_in_its_state_until_it_clears() -> None:
    reconciler, kube = setup()
    kube.foreign_lease()
    assert reconcile(reconciler, "team-a", "report") == RECHECK
    assert states() == {"guarded": 0, "invalid": 0, "conflict": 1}
    kube.foreign_lease(present=False)
    reconcile(reconciler, "team-a", "report")
    assert states() == {"guarded": 1, "invalid": 0, "conflict": 0}


def test_a_conflict_rechecked_later_is_not_counted_as_a_reconcile_error() -> None:
    """Review finding 21: the look-again-in-a-minute of a refused CronJob counted one
    reconcile error a minute for as long as the conflict lasted; a transient error counts."""
    reconciler, kube = setup()
    kube.foreign_lease()
    before = counted_errors()
    assert asyncio.run(reconciler._reconcile(CronJobKey("team-a", "report"))) == RECHECK
    assert counted_errors() == before
    kube.foreign_lease(present=False)
    kube.fail["create_lease"] = Retry("create lease team-a/cronlock-report: HTTP 503")
    with pytest.raises(Retry):
        asyncio.run(reconciler._reconcile(CronJobKey("team-a", "report")))
    assert counted_errors() == before + 1


def test_a_lease_used_by_an_unseen_cronjob_is_undecided_a_counted_retry_not_a_refusal() -> None:
    """The executor's verdict comes back as a value: consent cannot be decided while a user
    of the lock is not seen yet, so the reconcile asks for a retry with backoff (a raised
    Retry, counted as an error), posts no Conflict and guards nothing."""
    reconciler, kube = setup()
    used = make_lease(namespace="team-a", owners=[("gone", "uid-gone")], resource_version="3")
    kube.leases[("team-a", "cronlock-report")] = copy.deepcopy(used)
    reconciler.on_lease("ADDED", used)
    before = counted_errors()
    with pytest.raises(Retry, match=r"not \(yet\) seen"):
        asyncio.run(reconciler._reconcile(CronJobKey("team-a", "report")))
    assert counted_errors() == before + 1
    assert reasons(kube) == []
    assert kube.patches == 0
    assert reconciler.guarding.book.guard(("team-a", "report")) is None


def test_a_foreign_role_holds_back_only_the_cronjobs_of_its_account() -> None:
    reconciler, kube = setup(export="exporter")
    kube.foreign_role("team-a")
    assert reconcile(reconciler, "team-a", "report") == RECHECK
    assert reconcile(reconciler, "team-a", "export") == DONE
    assert reasons(kube) == ["Conflict", "Injected"]
    assert kube.patches == 1
    assert kube.rbac.names("Role", "team-a") == [
        "cronlock-holder-default",
        "cronlock-holder-exporter",
    ]
    foreign = kube.rbac.objects[("Role", "team-a", "cronlock-holder-default")]
    assert foreign == {"metadata": {"name": "cronlock-holder-default"}}  # left as it was


def test_a_refused_patch_is_one_warning_and_no_retry() -> None:
    reconciler, kube = setup()
    kube.fail["patch_cronjob"] = Rejected('CronJob.batch "report" is invalid: restartPolicy')
    before = counted_errors()
    with pytest.raises(Rejected):  # it ends the CronJob's reconcile, and only that
        reconcile(reconciler, "team-a", "report")
    # Where a reconcile ends, the runtime tells it once, counts it, and does not retry.
    for _ in range(2):
        assert asyncio.run(reconciler._reconcile(CronJobKey("team-a", "report"))) == DONE
    assert counted_errors() == before + 2
    assert reasons(kube) == ["ReconcileError"]
    assert "the API server refused cronlock's change" in kube.events[0][2]
    del kube.fail["patch_cronjob"]
    reconcile(reconciler, "team-a", "report")
    assert reasons(kube) == ["ReconcileError", "Injected"]


def test_start_up_writes_every_namespaces_holder_rbac_once_before_the_reconciles() -> None:
    kube = Kube()
    kube.foreign_role("team-c")
    reconciler = Reconciler(kube=kube, settings=SETTINGS)
    for namespace in ("team-a", "team-b", "team-c"):
        for name in ("report", "export"):
            body = server_defaults(gen.cronjob(name, gen.in_namespace(namespace)))
            body["metadata"]["uid"] = f"uid-{namespace}-{name}"
            kube.cronjobs[(namespace, name)] = copy.deepcopy(body)
            reconciler.cronjobs.put(body)  # as the start-up list fills the cache

    asyncio.run(reconciler.sync_all_rbac())  # the foreign Role in team-c is no reason to stop

    assert sorted(kube.rbac_syncs()) == ["team-a", "team-b", "team-c"]
    for namespace in ("team-a", "team-b"):
        granted = {guard.lease for guard in reconciler.holder_rbac.synced[namespace]}
        assert granted == {"cronlock-report", "cronlock-export"}
    assert "team-c" not in reconciler.holder_rbac.synced
    for namespace in ("team-a", "team-b"):
        for name in ("report", "export"):
            reconcile(reconciler, namespace, name)
    # Each CronJob found its namespace's Roles written: no more RBAC writes, only patches.
    assert sorted(kube.rbac_syncs()) == ["team-a", "team-b", "team-c"]
    assert kube.patches == 4
    # team-c's CronJobs are refused by their own reconcile.
    assert reconcile(reconciler, "team-c", "report") == RECHECK
    assert reasons(kube).count("Conflict") == 1


def test_a_namespace_whose_rbac_fails_at_start_up_is_logged_and_stops_no_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = Kube()
    kube.rbac.fail["read"] = lambda kind, namespace, name: (
        ConnectionError("the API server went away") if namespace == "team-b" else None
    )
    reconciler = Reconciler(kube=kube, settings=SETTINGS)
    for namespace in ("team-a", "team-b", "team-c"):
        body = server_defaults(gen.cronjob("report", gen.in_namespace(namespace)))
        body["metadata"]["uid"] = f"uid-{namespace}"
        reconciler.cronjobs.put(body)

    with caplog.at_level(logging.WARNING):
        asyncio.run(reconciler.sync_all_rbac())

    assert sorted(kube.rbac_syncs()) == ["team-a", "team-c"]
    assert "team-b" not in reconciler.holder_rbac.synced  # the RbacKey its CronJob asks for
    assert "holder RBAC in team-b not written yet: the API server went away" in caplog.text


KEYS = [
    "cronlock.io/enabled",
    "cronlock.io/lock",
    "cronlock.io/ttl",
    "cronlock.io/renew",
    "cronlock.io/policy",
    "cronlock.io/wait-timeout",
    "cronlock.io/stop",
    "cronlock.io/alert-after",
    "cronlock.io/keep-skipped-jobs",
    "cronlock.io/consecutive-skips",
    "cronlock.io/original-restart-policy",
    "cronlock.io/original-share-process-namespace",
    "cronlock.io/original-termination-grace-period-seconds",
    "cronlock.io/unknown",
]
VALUES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["true", "false", "", "0", "-1", "1e9", "9" * 5000, "30s", "1h", "wait"]),
    st.integers(min_value=0, max_value=10**30).map(str),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    annotations=st.one_of(
        st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=1),
        st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6),
    )
)
@example(annotations={"cronlock.io/alert-after": "9" * 5000})
@example(annotations={"cronlock.io/consecutive-skips": "9" * 5000})
@example(annotations={"cronlock.io/original-termination-grace-period-seconds": "9" * 5000})
@example(annotations={"cronlock.io/original-restart-policy": "Always"})
def test_no_annotation_on_one_cronjob_stops_another_in_its_namespace(
    annotations: dict[str, str],
) -> None:
    """Fuzzed: whatever one CronJob carries, reconciling it ends normally, with an Event
    or with a retry, and the next CronJob of the namespace is injected as usual."""
    reconciler, kube = setup(export="default")
    hostile = reconciler.cronjobs.get(("team-a", "report"))
    assert hostile is not None
    hostile["metadata"]["annotations"] = {"cronlock.io/enabled": "true", **annotations}
    reconciler.on_cronjob("MODIFIED", hostile)
    with contextlib.suppress(Retry):
        reconcile(reconciler, "team-a", "report")
    reconcile(reconciler, "team-a", "export")
    assert kube.reasons()[-1] == "Injected"
    assert reconciler.guarding.book.guard(("team-a", "export")) is not None
    assert any(
        guard.lease == "cronlock-export" for guard in reconciler.holder_rbac.synced["team-a"]
    )


def test_the_watch_event_of_our_own_patch_is_not_reconciled_again() -> None:
    reconciler, kube = setup()
    key = CronJobKey("team-a", "report")
    reconciler.queue = type(reconciler.queue)(reconciler.queue.work)  # forget setup's keys
    reconcile(reconciler, "team-a", "report")
    assert kube.patches == 1
    body = reconciler.cronjobs.get(("team-a", "report"))
    assert body is not None
    answered = kube.cronjobs[("team-a", "report")]["metadata"]["resourceVersion"]
    body["metadata"]["resourceVersion"] = answered  # what the patch answered
    reconciler.on_cronjob("MODIFIED", body)
    assert not reconciler.queue.waiting(key)
    body["metadata"]["resourceVersion"] = answered + "0"  # someone else's change after ours
    reconciler.on_cronjob("MODIFIED", body)
    assert reconciler.queue.waiting(key)


def test_a_day_long_hold_seen_at_start_up_is_believed_only_for_its_owners_ttl() -> None:
    """Security review L1: the operator (re)starts, sees a dead day-long hold before its
    CronJob's first reconcile; once the CronJob is reconciled, the hold is judged by its
    lock's ttl (60 s here), not the day the holder wrote."""
    now = [1000.0]
    kube = Kube()
    reconciler = Reconciler(kube=kube, settings=SETTINGS, clock=lambda: now[0])
    squatted = make_lease(
        "squatter_12345678",
        namespace="team-a",
        duration=86400,
        owners=[("report", "uid-report")],
        resource_version="5",
    )
    kube.leases[("team-a", "cronlock-report")] = copy.deepcopy(squatted)
    reconciler.on_lease("ADDED", squatted)
    body = server_defaults(gen.cronjob("report"))
    body["metadata"]["uid"] = "uid-report"
    kube.cronjobs[("team-a", "report")] = copy.deepcopy(body)
    reconciler.on_cronjob("ADDED", body)
    now[0] += 3600
    assert list(reconciler.expiry.observations.overdue(now[0], SETTINGS.skew_seconds)) == []
    reconcile(reconciler, "team-a", "report")
    assert list(reconciler.expiry.observations.overdue(now[0], SETTINGS.skew_seconds)) == [
        ("team-a", "cronlock-report")
    ]


IN_TEAM_A = (gen.in_namespace("team-a"),)


@pytest.mark.parametrize(
    ("holder", "cleared"),
    [
        # A pod owned by no Job (a web app's, a bare pod) on the runs' account.
        ("web-7f9c_aaaaaaaa", True),
        # A Job's pod, but the Job is no run of the lock's CronJobs.
        ("other-1-abcde_bbbbbbbb", True),
        # A run: its Job's owner is the CronJob on the lock (scheduled or --from).
        ("report-1-abcde_cccccccc", False),
        # `cronlock-sidecar run` outside Kubernetes: names no pod at all.
        ("build-host_4242_0a1b2c3d", False),
        # A pod that is gone, or another under its name: its token died with it.
        ("gone-abcde_dddddddd", False),
        ("reused_eeeeeeee", False),
    ],
)
def test_a_hold_by_a_pod_that_is_no_run_of_the_lock_is_cleared_with_a_warning(
    holder: str, cleared: bool
) -> None:
    """Security review N4: a pod on the runs' account claims the free Lease in its own name;
    the operator clears it as soon as it sees it, and says who. A run's hold, and a holder
    that names no live pod, are left alone, and looked at once only."""
    reconciler, kube = setup(report="reports")
    reconcile(reconciler, "team-a", "report")
    kube.pods.update(
        {
            ("team-a", "web-7f9c"): gen.pod(
                "web-7f9c", "reports", *IN_TEAM_A, gen.with_uid("aaaaaaaa-1")
            ),
            ("team-a", "other-1-abcde"): gen.pod(
                "other-1-abcde",
                "reports",
                *IN_TEAM_A,
                gen.with_uid("bbbbbbbb-1"),
                gen.controlled_by("Job", "other-1", "j-o"),
            ),
            ("team-a", "report-1-abcde"): gen.pod(
                "report-1-abcde",
                "reports",
                *IN_TEAM_A,
                gen.with_uid("cccccccc-1"),
                gen.controlled_by("Job", "report-1", "j-r"),
            ),
            ("team-a", "reused"): gen.pod(
                "reused", "reports", *IN_TEAM_A, gen.with_uid("ffffffff-1")
            ),
        }
    )
    kube.jobs.update(
        {
            ("team-a", "other-1"): gen.job(
                "other-1",
                *IN_TEAM_A,
                gen.with_uid("j-o"),
                gen.controlled_by("CronJob", "x", "uid-other"),
            ),
            ("team-a", "report-1"): gen.job(
                "report-1",
                *IN_TEAM_A,
                gen.with_uid("j-r"),
                gen.controlled_by("CronJob", "x", "uid-report"),
            ),
        }
    )
    held = make_lease(
        holder, namespace="team-a", owners=[("report", "uid-report")], resource_version="9"
    )
    kube.leases[("team-a", "cronlock-report")] = copy.deepcopy(held)
    kube.calls.clear()
    reconciler.on_lease("MODIFIED", held)
    key = LeaseKey("team-a", "cronlock-report")
    assert reconciler.queue.waiting(key), "a new holder is looked at at once"
    assert reconciler.expiry.reconcile(key) == DONE
    patches = [args for name, args in kube.calls if name == "patch_lease"]
    events = [event for event in kube.events if event[1] == "ForeignHolder"]
    if cleared:
        [(_, _, patch)] = patches
        assert {"op": "test", "path": "/spec/holderIdentity", "value": holder} in patch
        assert {"op": "remove", "path": "/spec/holderIdentity"} in patch
        [(name, _, message, warning)] = events
        assert (name, warning) == ("report", True)
        assert holder in message
        assert "ServiceAccount of its own" in message
    else:
        assert (patches, events) == ([], [])
        # Vetted once: its renewals are not looked at again.
        kube.calls.clear()
        renewed = copy.deepcopy(held)
        renewed["spec"]["renewTime"] = "2030-01-01T00:00:00.000000Z"
        renewed["metadata"]["resourceVersion"] = "10"
        reconciler.queue = WorkQueue(reconciler.queue.work)
        reconciler.on_lease("MODIFIED", renewed)
        assert not reconciler.queue.waiting(key)


def test_a_cronjob_on_its_way_out_is_left_to_the_garbage_collector() -> None:
    """An orphaning delete sets deletionTimestamp and the collector drops the CronJob from
    its Lease's owners: a reconcile then must not write (join the Lease again, patch the
    CronJob), or the collector later deletes the Lease as a deleted owner's dependent."""
    reconciler, kube = setup()
    reconcile(reconciler, "team-a", "report")
    # The collector's orphaning: the Lease has no owner now, and the operator has seen it.
    lease = kube.leases[("team-a", "cronlock-report")]
    lease["metadata"]["ownerReferences"] = []
    lease["metadata"]["resourceVersion"] += "1"
    reconciler.on_lease("MODIFIED", copy.deepcopy(lease))
    kube.calls.clear()
    body = copy.deepcopy(kube.cronjobs[("team-a", "report")])
    body["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    body["metadata"]["finalizers"] = ["orphan"]
    body["metadata"]["resourceVersion"] += "1"
    reconciler.on_cronjob("MODIFIED", body)
    assert reconcile(reconciler, "team-a", "report") == DONE
    assert kube.calls == []


def test_the_kinds_meet_through_the_queue_a_cronjob_waits_for_its_holder_rbac_key() -> None:
    """As the worker threads run them: the CronJob reconcile asks for its namespace's
    RbacKey (handed to the event loop's queue) and waits; once that key is reconciled the
    router queues the CronJob again, which is then injected."""
    reconciler, kube = setup()
    reconciler.queue = WorkQueue(reconciler.queue.work)  # what is queued from here on
    cronjob, rbac = CronJobKey("team-a", "report"), RbacKey("team-a")
    assert asyncio.run(reconciler._reconcile(cronjob)) == DONE
    assert kube.patches == 0
    assert reconciler.queue.waiting(rbac)
    assert not reconciler.queue.waiting(cronjob)
    assert asyncio.run(reconciler._reconcile(rbac)) == DONE
    assert kube.rbac.names("Role", "team-a") == ["cronlock-holder-default"]
    assert reconciler.queue.waiting(cronjob)
    assert asyncio.run(reconciler._reconcile(cronjob)) == DONE
    assert kube.patches == 1


def test_a_holder_rbac_key_that_fails_tells_the_cronjobs_waiting_for_it() -> None:
    reconciler, kube = setup()
    kube.rbac.fail["read"] = ConnectionError("the API server went away")
    reconciler.guarding.reconcile(CronJobKey("team-a", "report"))
    with pytest.raises(ConnectionError):
        asyncio.run(reconciler._reconcile(RbacKey("team-a")))
    [(name, reason, message, warning)] = kube.events
    assert (name, reason, warning) == ("report", "ReconcileError", True)
    assert "the API server went away" in message
    assert kube.patches == 0
