"""The chart's annotation policy on the real API server: `kubectl apply` of a CronJob with a
bad cronlock.io/* annotation prints cronlock's reason (Warn) or is refused (Deny), a valid
one applies silently, and on a corpus of good and bad values, every example of the
operator's own annotation tests among them, the policy warns exactly where `cronlock lint`
finds an error."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from cronlock_operator.lint.admission import MESSAGE_PREFIX
from cronlock_operator.lint.checks import check
from cronlock_operator.lint.documents import Manifest
from cronlock_operator.settings import OperatorSettings
from tests.support import gen
from tests.support.annotation_cases import BAD
from tests.support.controlplane import ControlPlane
from tests.support.kube import run_tool, wait_for
from tests.support.operator import CHART, OPERATOR_NAMESPACE, render_chart
from tests.support.papers import INSTALL_MD, marked_block

# As `cronlock lint` reads under the chart's defaults: both sidecar images given.
LINT_SETTINGS = OperatorSettings(
    sidecar_image="ghcr.io/example/cronlock:1.0.0",
    sidecar_stores_image="ghcr.io/example/cronlock-stores:1.0.0",
)
STORE = {"cronlock.io/store": "redis", "cronlock.io/store-secret": "orders-redis"}
GOOD: list[dict[str, str]] = [
    {},
    {"cronlock.io/enabled": "false", "cronlock.io/ttl": "5"},  # opted out: never judged
    {"cronlock.io/lock": "orders.db-1"},
    {"cronlock.io/lock": "a" * 63},
    {"cronlock.io/ttl": "19s"},
    {"cronlock.io/ttl": "24h"},
    {"cronlock.io/ttl": "1m30s"},
    {"cronlock.io/ttl": " 90s "},
    {"cronlock.io/ttl": "20000ms"},
    {"cronlock.io/ttl": "90s", "cronlock.io/renew": "30s"},
    {"cronlock.io/renew": "1s"},
    {"cronlock.io/renew": "20s"},
    {"cronlock.io/renew": "1.5s"},
    {"cronlock.io/policy": "replace"},
    {"cronlock.io/policy": "wait", "cronlock.io/wait-timeout": "24h"},
    {"cronlock.io/policy": "skip", "cronlock.io/wait-timeout": "0"},
    {"cronlock.io/max-hold": "40s"},
    {"cronlock.io/max-hold": "168h"},
    {"cronlock.io/max-hold": "0", "cronlock.io/policy": "observe"},
    {"cronlock.io/ttl": "19s", "cronlock.io/renew": "5s", "cronlock.io/max-hold": "10s"},
    {"cronlock.io/jitter": "0"},
    {"cronlock.io/jitter": "30s"},
    {"cronlock.io/jitter": "1.5s"},
    {"cronlock.io/jitter": "1h"},
    {"cronlock.io/stop": "signal"},
    {"cronlock.io/stop": "auto"},
    {"cronlock.io/alert-after": "1"},
    {"cronlock.io/alert-after": "1000"},
    {"cronlock.io/alert-after-missed": "0"},
    {"cronlock.io/keep-skipped-jobs": "true"},
    {"cronlock.io/permits": "1"},
    {"cronlock.io/permits": "16"},
    {"cronlock.io/permits": " 3 "},
    {"cronlock.io/permits": "4", "cronlock.io/policy": "wait", "cronlock.io/wait-timeout": "5m"},
    {**STORE, "cronlock.io/permits": "1"},
    {**STORE, "cronlock.io/permits": "2"},
    {"cronlock.io/permits": "3", "cronlock.io/policy": "queue"},
    {"cronlock.io/permits": "1", "cronlock.io/policy": "replace"},
    {"cronlock.io/share-lock-with": "import-orders, rebuild-index"},
    STORE,
    {**STORE, "cronlock.io/store": "postgres"},
    {"cronlock.io/consecutive-skips": "2"},  # the operator's own
]
MORE_BAD: list[dict[str, str]] = [
    {"cronlock.io/ttl": "5"},
    {"cronlock.io/ttl": "0"},
    {"cronlock.io/ttl": "18s"},
    {"cronlock.io/ttl": "1.5m30.5s"},
    {"cronlock.io/ttl": "20s", "cronlock.io/renew": "7s"},
    {"cronlock.io/ttl": "nonsense", "cronlock.io/renew": "2s"},
    {"cronlock.io/store": "etcd"},
    {"cronlock.io/store": "redis"},
    {"cronlock.io/store-secret": "orders-redis"},
    {**STORE, "cronlock.io/store-secret": "Orders_Redis"},
    {**STORE, "cronlock.io/stop": "signal"},
    {"cronlock.io/share-lock-with": "import-orders,,rebuild-index"},
    {"cronlock.io/share-lock-with": "Import_Orders"},
    {"cronlock.io/share-lock-with": ",".join(f"job-{n}" for n in range(101))},
    {"cronlock.io/alert-after": "00001"},
    {"cronlock.io/policy": "skip", "cronlock.io/wait-timeout": "1s"},
    {"cronlock.io/ttl": "19s", "cronlock.io/max-hold": "12s"},
    {"cronlock.io/renew": "10s", "cronlock.io/max-hold": "19s"},
]
# The operator's own table of bad annotations (tests/unit/operator/test_config.py) that
# need nothing of the pod: the policy judges annotations, and leaves containers to lint.
BAD_ANNOTATIONS = [annotations for annotations, extra, _, _ in BAD if not extra] + MORE_BAD


def lint_errors(body: dict[str, Any], namespace: str) -> list[str]:
    findings = check([Manifest("corpus.yaml", 1, body)], LINT_SETTINGS, namespace)
    return [finding.message for finding in findings if finding.severity == "error"]


@dataclass(frozen=True)
class Applied:
    """`kubectl apply`'s exit code, what it printed of the policy (`said`: lines naming it,
    `warnings`: the reasons in them) and its whole stderr. Other releases' policies in the
    shared control plane may warn too: only this test's policy's lines are its."""

    code: int
    warnings: list[str]
    said: list[str]
    stderr: str
    stdout: str


def apply(
    controlplane: ControlPlane,
    namespace: str,
    body: dict[str, Any],
    policy: str,
    *,
    dry_run: bool = False,
) -> Applied:
    args = ["kubectl", "apply", "-n", namespace, "-f", "-"]
    if dry_run:
        args.append("--dry-run=server")
    result = run_tool(controlplane.env, *args, input_text=json.dumps(body), check=False)
    said = [line for line in result.stderr.splitlines() if f"'{policy}'" in line]
    warnings = [
        line.split(f"{MESSAGE_PREFIX} ", 1)[1] for line in said if f"{MESSAGE_PREFIX} " in line
    ]
    return Applied(result.returncode, warnings, said, result.stderr, result.stdout)


# The release's name for its accounts in the Deny policy (fullnameOverride): accounts no
# other test's policy confines (the session's operator-scope policy confines `cronlock`'s,
# and refuses the operator's account any CronJob create).
OWN = "annot-own"


def install_policy(
    controlplane: ControlPlane, namespace: str, action: str, *values: str
) -> Iterator[str]:
    """The chart's annotation policy and binding, for this namespace alone (watchNamespaces),
    under a release of its own, named as the policy; removed afterwards."""
    release = f"warn-{secrets.token_hex(3)}"
    docs = policy_objects(
        controlplane,
        f"watchNamespaces={{{namespace}}}",
        f"admissionPolicy.annotations={action}",
        *values,
    )
    assert [doc["kind"] for doc in docs] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for doc in docs:
        doc["metadata"]["name"] = doc["metadata"]["name"].replace("cronlock", release, 1)
    docs[1]["spec"]["policyName"] = docs[0]["metadata"]["name"]
    text = yaml.safe_dump_all(docs)
    controlplane.kubectl("apply", "-f", "-", input_text=text)
    name = docs[0]["metadata"]["name"]
    probe = gen.cronjob("probe", gen.in_namespace(None), gen.annotated({"cronlock.io/ttl": "5"}))
    wait_for(
        lambda: apply(controlplane, namespace, probe, name, dry_run=True).warnings,
        timeout=30,
        what="the annotation policy to judge CronJobs",
    )
    yield name
    controlplane.kubectl("delete", "-f", "-", "--wait=false", input_text=text)


@pytest.fixture
def warned(controlplane: ControlPlane, namespace: str) -> Iterator[str]:
    yield from install_policy(controlplane, namespace, "Warn")


@pytest.fixture
def denied(controlplane: ControlPlane, namespace: str) -> Iterator[str]:
    yield from install_policy(controlplane, namespace, "Deny", f"fullnameOverride={OWN}")


@pytest.mark.timeout(120)
def test_kubectl_apply_prints_cronlocks_warning(
    controlplane: ControlPlane, namespace: str, warned: str
) -> None:
    applied = apply(
        controlplane,
        namespace,
        gen.cronjob("report", gen.in_namespace(None), gen.annotated({"cronlock.io/ttl": "5"})),
        warned,
    )
    # What docs/INSTALL.md shows, word for word, but for the policy's name (this test's
    # release; the docs' is release cronlock in cronlock-system).
    shown = marked_block(INSTALL_MD, "annotation-warning").splitlines()
    assert shown[0] == "$ kubectl apply -f report.yaml"
    printed = [
        line.replace(warned, "cronlock-cronlock-system-annotations") for line in applied.said
    ]
    assert printed + applied.stdout.splitlines() == shown[1:], applied.stderr
    # Written all the same: Warn only tells.
    controlplane.kubectl("get", "cronjob", "report", "-n", namespace)
    applied = apply(
        controlplane,
        namespace,
        gen.cronjob("report", gen.in_namespace(None), gen.annotated({"cronlock.io/ttl": "5s"})),
        warned,
    )
    assert applied.code == 0, applied.stderr
    assert applied.warnings == [
        'cronlock.io/ttl: "5s" is too short to stop a run that lost its lease before another '
        "run may take it (renew deadline, probe, kill grace and clock skew must stay under "
        "the ttl); use a ttl of at least 19s"
    ], applied.stderr
    # A valid CronJob, and an update that leaves the annotations as they are, say nothing.
    applied = apply(
        controlplane,
        namespace,
        gen.cronjob("fine", gen.in_namespace(None), gen.annotated({"cronlock.io/ttl": "60s"})),
        warned,
    )
    assert applied.code == 0, applied.stderr
    assert applied.said == [], applied.stderr
    patched = run_tool(
        controlplane.env,
        "kubectl", "patch", "cronjob", "report", "-n", namespace, "-p", '{"spec":{"suspend":true}}',
    )  # fmt: skip
    assert warned not in patched.stderr, patched.stderr


@pytest.mark.timeout(120)
def test_cronlocks_own_accounts_are_not_judged_even_under_deny(
    controlplane: ControlPlane, namespace: str, denied: str
) -> None:
    """The operator (injection, revert) and the release's hooks (revert): the chart's
    policy is rendered for release cronlock in cronlock-system (render_chart), its accounts
    named `OWN`."""
    body = json.dumps(
        gen.cronjob("report", gen.in_namespace(None), gen.annotated({"cronlock.io/ttl": "5s"}))
    )
    for account in (OWN, f"{OWN}-narrowed", f"{OWN}-uninstall"):
        written = run_tool(
            controlplane.env,
            "kubectl", "apply", "--dry-run=server", "-n", namespace, "-f", "-",
            f"--as=system:serviceaccount:{OPERATOR_NAMESPACE}:{account}",
            "--as-group=system:masters",
            input_text=body,
            check=False,
        )  # fmt: skip
        assert written.returncode == 0, written.stderr
        assert denied not in written.stderr
    # Another account of that namespace is judged like anyone.
    refused = run_tool(
        controlplane.env,
        "kubectl", "apply", "--dry-run=server", "-n", namespace, "-f", "-",
        f"--as=system:serviceaccount:{OPERATOR_NAMESPACE}:deployer",
        "--as-group=system:masters",
        input_text=body,
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert f"'{denied}'" in refused.stderr, refused.stderr


@pytest.mark.timeout(120)
def test_deny_refuses_the_write_and_admits_a_valid_cronjob(
    controlplane: ControlPlane, namespace: str, denied: str
) -> None:
    applied = apply(
        controlplane,
        namespace,
        gen.cronjob("report", gen.in_namespace(None), gen.annotated({"cronlock.io/ttl": "5s"})),
        denied,
    )
    assert applied.code != 0
    assert applied.said[0].startswith('The cronjobs "report" is invalid: ')
    assert 'denied request: cronlock: cronlock.io/ttl: "5s" is too short' in applied.said[0]
    assert "report" not in controlplane.kubectl("get", "cronjobs", "-n", namespace, "-o", "name")
    applied = apply(
        controlplane,
        namespace,
        gen.cronjob("report", gen.in_namespace(None), gen.annotated({"cronlock.io/ttl": "60s"})),
        denied,
    )
    assert applied.code == 0, applied.stderr
    assert applied.said == [], applied.stderr


@pytest.mark.timeout(120)
def test_deny_refuses_a_hostile_jitter_and_admits_a_valid_one(
    controlplane: ControlPlane, namespace: str, denied: str
) -> None:
    """Huge, negative and garbage jitters never reach the operator under Deny; the
    legitimate write passes on the same set-up."""
    for value, reason in (
        ("1000000h", "is out of range; expected a duration from 0 (no jitter) to 1h"),
        ("61m", "is out of range; expected a duration from 0 (no jitter) to 1h"),
        ("-30s", "is not a duration"),
        ("30", "is not a duration"),
        ("$(sleep 99)", "is not a duration"),
    ):
        applied = apply(
            controlplane,
            namespace,
            gen.cronjob(
                "report", gen.in_namespace(None), gen.annotated({"cronlock.io/jitter": value})
            ),
            denied,
        )
        assert applied.code != 0, value
        assert (
            f'denied request: cronlock: cronlock.io/jitter: "{value}" {reason}' in applied.said[0]
        ), applied.said
    assert "report" not in controlplane.kubectl("get", "cronjobs", "-n", namespace, "-o", "name")
    applied = apply(
        controlplane,
        namespace,
        gen.cronjob("report", gen.in_namespace(None), gen.annotated({"cronlock.io/jitter": "30s"})),
        denied,
    )
    assert applied.code == 0, applied.stderr
    assert applied.said == [], applied.stderr


@pytest.mark.timeout(300)
def test_the_policy_warns_where_lint_finds_an_error(
    controlplane: ControlPlane, namespace: str, warned: str
) -> None:
    corpus = [(annotations, True) for annotations in BAD_ANNOTATIONS] + [
        (annotations, False) for annotations in GOOD
    ]

    def verdicts(case: tuple[dict[str, str], bool]) -> tuple[list[str], Applied]:
        annotations, _ = case
        body = gen.cronjob(
            "corpus",
            gen.in_namespace(None),
            gen.annotated(annotations),
            gen.service_account("reports"),
        )
        applied = apply(controlplane, namespace, body, warned, dry_run=True)
        assert applied.code == 0, applied.stderr
        return lint_errors(body, namespace), applied

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(verdicts, corpus))
    # A bad value gets cronlock's reason; a good one no warning at all (nor an error of
    # the policy's own CEL, which kubectl would print as a warning too).
    disagree = [
        (annotations, errors, applied)
        for (annotations, _), (errors, applied) in zip(corpus, results, strict=True)
        if bool(errors) != bool(applied.warnings) or (not errors and applied.said)
    ]
    assert not disagree, "\n".join(
        f"{annotations}: lint {errors or 'clean'}; kubectl: {applied.said or 'silent'}"
        for annotations, errors, applied in disagree
    )
    # The corpus says what it claims: the bad ones are bad to lint too.
    assert [bad for _, bad in corpus] == [bool(errors) for errors, _ in results]


@pytest.mark.timeout(120)
def test_a_cronjob_the_operator_would_not_guard_is_not_judged(
    controlplane: ControlPlane, namespace: str, warned: str
) -> None:
    unguarded = gen.cronjob(
        "plain", gen.in_namespace(None), gen.with_annotations({"cronlock.io/ttl": "5"})
    )
    applied = apply(controlplane, namespace, unguarded, warned, dry_run=True)
    assert applied.code == 0, applied.stderr
    assert applied.said == [], applied.stderr
    assert not lint_errors(unguarded, namespace)
    # In a namespace labelled for opt-in it is guarded, and judged.
    controlplane.kubectl("label", "namespace", namespace, "cronlock.io/enabled=true")
    own_account = gen.cronjob(
        "plain",
        gen.in_namespace(None),
        gen.with_annotations({"cronlock.io/ttl": "5"}),
        gen.service_account("reports"),
    )
    warnings = wait_for(
        lambda: apply(controlplane, namespace, own_account, warned, dry_run=True).warnings,
        timeout=30,
        what="the policy to see the namespace's label",
    )
    assert warnings[0].startswith('cronlock.io/ttl: "5"'), warnings
    # Lint says so too, told the namespace is labelled.
    labelled = check(
        [Manifest("corpus.yaml", 1, own_account)], LINT_SETTINGS, namespace, [namespace]
    )
    assert any(finding.severity == "error" for finding in labelled)


def policy_objects(controlplane: ControlPlane, *values: str) -> list[dict[str, Any]]:
    return [
        doc
        for doc in render_chart(controlplane.env, *values)
        if doc["kind"].startswith("ValidatingAdmissionPolicy")
        and doc["metadata"]["name"].endswith("-annotations")
    ]


@pytest.mark.timeout(60)
def test_warn_is_the_default_deny_an_option_and_off_renders_nothing(
    controlplane: ControlPlane,
) -> None:
    policy, binding = policy_objects(controlplane)
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Warn"],
    }
    _, binding = policy_objects(controlplane, "admissionPolicy.annotations=Deny")
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy_objects(controlplane, "admissionPolicy.annotations=Off") == []
    failed = run_tool(
        controlplane.env,
        "helm",
        "template",
        "r",
        str(CHART),
        "--set",
        "admissionPolicy.annotations=warn",
        check=False,
    )
    assert failed.returncode != 0
    assert (
        "/admissionPolicy/annotations': value must be one of 'Warn', 'Deny', 'Off'" in failed.stderr
    )
