"""Another mutating webhook or policy changes what cronlock writes into a CronJob (issue 41):
the operator writes once, says what admission changed in one Event, and does not fight it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.reconcile import cronjobs
from cronlock_operator.runtime.reconciler import Reconciler
from cronlock_sidecar.contract import VOLUME_NAME
from tests.support import gen
from tests.support.cronjobs import SETTINGS, server_defaults
from tests.support.fakekube import FakeKube
from tests.support.metrics import cronjob_states
from tests.support.reconciling import reconcile_cronjob

Mutator = Callable[[dict[str, Any]], None]


def cpu_limit_everywhere(cronjob: dict[str, Any]) -> None:
    """Kyverno-like: every container lacking a CPU limit gets one (cronlock sets none)."""
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        container.setdefault("resources", {}).setdefault("limits", {}).setdefault("cpu", "250m")


def sidecar_command_replaced(cronjob: dict[str, Any]) -> None:
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    for container in spec.get("initContainers", []):
        if container["name"] == "cronlock":
            container["command"] = ["/bin/wrapped", *container.get("command", [])]


class Admitting(FakeKube):
    """The in-memory API server with one mutating admission step on every CronJob write."""

    def __init__(self, mutator: Mutator) -> None:
        super().__init__()
        self.mutator = mutator

    def patch_cronjob(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        before = copy.deepcopy(self.cronjobs[(namespace, name)])
        answer = super().patch_cronjob(namespace, name, patch)
        assert answer is not None
        self.mutator(answer)
        after = {k: v for k, v in answer.items() if k != "metadata"}
        if after == {k: v for k, v in before.items() if k != "metadata"}:
            answer["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"]
        self.cronjobs[(namespace, name)] = copy.deepcopy(answer)
        return answer

    @property
    def patches(self) -> int:
        return len(self.called("patch_cronjob"))


def setup(mutator: Mutator) -> tuple[Reconciler, Admitting]:
    kube = Admitting(mutator)
    reconciler = Reconciler(kube=kube, settings=SETTINGS)
    body = server_defaults(gen.cronjob("report", gen.restart_policy("Never")))
    body["metadata"]["uid"] = "uid-report"
    mutator(body)  # the user's create passed through admission too
    kube.cronjobs[("team-a", "report")] = copy.deepcopy(body)
    reconciler.on_cronjob("ADDED", body)
    return reconciler, kube


def tick(reconciler: Reconciler, kube: Admitting, change: Mutator | None = None) -> None:
    """Someone else writes the CronJob (its status, or the user): a watch event, reconciled."""
    stored = kube.cronjobs[("team-a", "report")]
    stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 100)
    stored.setdefault("status", {})["lastScheduleTime"] = stored["metadata"]["resourceVersion"]
    if change is not None:
        change(stored)
    reconciler.on_cronjob("MODIFIED", copy.deepcopy(stored))
    reconcile_cronjob(reconciler, "team-a", "report")


def test_added_resources_are_kept_with_one_normal_event_and_no_second_write() -> None:
    reconciler, kube = setup(cpu_limit_everywhere)
    reconcile_cronjob(reconciler, "team-a", "report")
    assert kube.patches == 1
    [(_, reason, message, warning)] = [e for e in kube.events if e[1] != "Injected"]
    assert reason == "ChangedByAdmission"
    assert not warning, "added resources leave the lock working"
    assert "spec.template.spec.initContainers[cronlock].resources.limits.cpu" in message
    assert "does not write it again" in message

    for _ in range(5):
        tick(reconciler, kube)
    assert kube.patches == 1, "status writes bring no patch: the template is as admitted"
    assert [e[1] for e in kube.events].count("ChangedByAdmission") == 1


def test_a_change_by_the_user_is_injected_again_and_judged_anew() -> None:
    reconciler, kube = setup(cpu_limit_everywhere)
    reconcile_cronjob(reconciler, "team-a", "report")

    def new_command(cronjob: dict[str, Any]) -> None:
        spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        spec["containers"][0]["command"] = ["sh", "-c", "echo changed"]

    tick(reconciler, kube, new_command)
    assert kube.patches == 2
    tick(reconciler, kube)
    assert kube.patches == 2


def test_another_image_for_the_sidecar_is_injected_over_in_the_admitted_state() -> None:
    reconciler, kube = setup(cpu_limit_everywhere)
    reconcile_cronjob(reconciler, "team-a", "report")

    def fake_image(cronjob: dict[str, Any]) -> None:
        spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        spec["initContainers"][0]["image"] = "registry.example/fake-lock:1"

    tick(reconciler, kube, fake_image)
    assert kube.patches == 2
    spec = kube.cronjobs[("team-a", "report")]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["image"] == SETTINGS.sidecar_image


def test_a_changed_sidecar_command_is_a_warning_that_says_what_to_exempt() -> None:
    reconciler, kube = setup(sidecar_command_replaced)
    reconcile_cronjob(reconciler, "team-a", "report")
    [(_, reason, message, warning)] = [e for e in kube.events if e[1] != "Injected"]
    assert (reason, warning) == ("ChangedByAdmission", True)
    assert "initContainers[cronlock].command" in message
    assert "exempt the containers cronlock and cronlock-gate" in message
    tick(reconciler, kube)
    assert kube.patches == 1


def test_without_a_mutator_nothing_is_remembered_or_said() -> None:
    reconciler, kube = setup(lambda cronjob: None)
    reconcile_cronjob(reconciler, "team-a", "report")
    assert [e[1] for e in kube.events] == ["Injected"]
    assert reconciler.guarding.admitted == {}
    tick(reconciler, kube)
    assert kube.patches == 1


def test_admission_judges_the_answer_against_what_was_asked() -> None:
    body = server_defaults(gen.cronjob("report", gen.restart_policy("Never")))
    desired = cronjobs.desired_cronjob(
        body, cronjobs.read_config(body, SETTINGS, Readings()).config, SETTINGS
    )
    answer = copy.deepcopy(desired)
    unchanged = cronjobs.admission(answer, desired, {})
    assert unchanged == cronjobs.Judged(None, [], {"ChangedByAdmission": None})
    cpu_limit_everywhere(answer)
    judged = cronjobs.admission(answer, desired, {})
    assert judged.admitted is not None
    assert judged.admitted.asked != judged.admitted.stored
    assert len(judged.actions) == 1
    assert not judged.stripped
    # The same message again is not posted twice.
    message = judged.posted["ChangedByAdmission"]
    assert message is not None
    assert cronjobs.admission(answer, desired, {"ChangedByAdmission": message}).actions == []


def containers_taken_out(cronjob: dict[str, Any]) -> None:
    """A mutator that allows no container it does not know: cronlock's two go."""
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    ours = ("cronlock", "cronlock-gate")
    spec["initContainers"] = [c for c in spec.get("initContainers", []) if c["name"] not in ours]


def injection_taken_out(cronjob: dict[str, Any]) -> None:
    """The same, and every other trace of the injection in the user's containers too."""
    containers_taken_out(cronjob)
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] != VOLUME_NAME]
    for container in spec["containers"]:
        mounts = [m for m in container.get("volumeMounts", []) if m["name"] != VOLUME_NAME]
        container["volumeMounts"] = mounts
        container.pop("livenessProbe", None)


@pytest.mark.parametrize("mutator", [injection_taken_out, containers_taken_out])
def test_an_injection_admission_takes_out_is_a_warning_and_counts_as_not_guarded(
    mutator: Mutator,
) -> None:
    reconciler, kube = setup(mutator)
    reconcile_cronjob(reconciler, "team-a", "report")
    [(_, _, message, warning)] = [e for e in kube.events if e[1] == "ChangedByAdmission"]
    assert warning
    assert "spec.template.spec.initContainers" in message
    assert states() == {"guarded": 0, "invalid": 0, "conflict": 1}
    tick(reconciler, kube)  # no second write, still not guarded: kept as admitted, or
    assert kube.patches == 1  # what is left of the injection is no longer injectable
    assert states()["guarded"] == 0
    assert states()["invalid"] + states()["conflict"] == 1
    del kube.cronjobs[("team-a", "report")]
    reconciler.on_cronjob("DELETED", {"metadata": {"namespace": "team-a", "name": "report"}})
    reconcile_cronjob(reconciler, "team-a", "report")
    assert states() == {"guarded": 0, "invalid": 0, "conflict": 0}


def states() -> dict[str, float]:
    return cronjob_states()
