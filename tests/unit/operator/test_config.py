"""What the user's cronlock.io/* annotations turn into, and the errors they get for bad ones."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from cronlock_operator.cronjob import reading as reading_module
from cronlock_operator.cronjob.config import (
    InvalidConfig,
    LockConfig,
    declined_because,
    declined_message,
    opt_in,
    parse_config,
)
from cronlock_operator.cronjob.defaults import LockDefaults
from cronlock_operator.cronjob.reading import (
    ConfigReading,
    Readings,
    counting_settings,
    read_config,
)
from cronlock_operator.cronjob.timing import (
    PROBE_TOLERANCES,
    ProbeTolerance,
    kill_grace_seconds,
    minimum_ttl_seconds,
    probe_tolerance,
)
from cronlock_operator.injection.build import build_injection
from cronlock_operator.leases.sharing import parse_peers, where_kept
from cronlock_operator.objects import annotations_of
from cronlock_operator.settings import OperatorSettings
from tests.support import gen
from tests.support.annotation_cases import BAD, PROBED
from tests.support.cronjobs import NEW_SETTINGS, SETTINGS, changed


def config_of(annotations: dict[str, str], *modifiers: gen.Modifier) -> LockConfig:
    return parse_config(gen.cronjob("report", gen.annotated(annotations), *modifiers), SETTINGS)


def test_defaults_follow_the_design() -> None:
    assert config_of({}) == LockConfig(
        lock="report",
        ttl_seconds=60,
        renew_seconds=20.0,
        policy="skip",
        wait_timeout_seconds=0.0,
        stop="liveness",
        kill_grace_seconds=10,
        alert_after=3,
        keep_skipped_jobs=False,
        skew_seconds=2,
        probe=ProbeTolerance(3, 2),
    )


def test_every_annotation_is_read() -> None:
    config = config_of(
        {
            "cronlock.io/lock": "nightly.reports",
            "cronlock.io/ttl": "5m",
            "cronlock.io/renew": "30s",
            "cronlock.io/policy": "wait",
            "cronlock.io/wait-timeout": "1m30s",
            "cronlock.io/stop": "signal",
            "cronlock.io/alert-after": "10",
            "cronlock.io/alert-after-missed": "0",
            "cronlock.io/keep-skipped-jobs": "true",
            "cronlock.io/max-hold": "2h",
        }
    )
    assert config == LockConfig(
        lock="nightly.reports",
        ttl_seconds=300,
        renew_seconds=30.0,
        policy="wait",
        wait_timeout_seconds=90.0,
        stop="signal",
        kill_grace_seconds=10,
        alert_after=10,
        keep_skipped_jobs=True,
        skew_seconds=2,
        probe=ProbeTolerance(3, 2),
        alert_after_missed=0,
        max_hold_seconds=7200.0,
    )
    assert config.lease_name == "cronlock-nightly.reports"
    assert config.renew_deadline_seconds == 200.0


@pytest.mark.parametrize(
    ("value", "labelled", "rule"),
    [
        ("true", False, "annotation"),
        ("true", True, "annotation"),
        ("false", False, "opted-out"),
        # A CronJob's own "false" keeps it out of its labelled namespace.
        ("false", True, "opted-out"),
        (None, False, "off"),
        (None, True, "namespace"),
    ],
)
def test_the_annotation_decides_first_then_the_namespace_label(
    value: str | None, labelled: bool, rule: str
) -> None:
    annotations = {} if value is None else {"cronlock.io/enabled": value}
    cronjob = gen.cronjob(
        "report", gen.with_annotations(annotations), gen.service_account("reports")
    )
    assert opt_in(cronjob, labelled) == rule


def test_the_label_alone_declines_the_account_default_and_an_imposed_signal() -> None:
    """Security review N4: the label does not grant the lock to `default`, every other
    pod's account, nor turn `auto` into `signal` for containers with their own probe.
    The CronJob's own annotation still decides for it (its author's choice)."""
    probe = {"exec": {"command": ["true"]}}
    probed = [{"name": "work", "image": "busybox", "livenessProbe": probe}]
    plain = gen.cronjob("report", gen.not_opted_in())
    assert opt_in(plain, True) == "declined"
    assert declined_because(plain) is not None
    assert "'default'" in (declined_because(plain) or "")
    named_default = gen.cronjob("report", gen.not_opted_in(), gen.service_account("default"))
    assert opt_in(named_default, True) == "declined"
    assert (
        opt_in(gen.cronjob("report", gen.not_opted_in(), gen.service_account("reports")), True)
        == "namespace"
    )
    own_probe = gen.cronjob(
        "report", gen.not_opted_in(), gen.containers(*probed), gen.service_account("reports")
    )
    assert opt_in(own_probe, True) == "declined"
    assert "work" in (declined_because(own_probe) or "")
    auto = gen.cronjob(
        "report",
        gen.with_annotations({"cronlock.io/stop": "auto"}),
        gen.containers(*probed),
        gen.service_account("reports"),
    )
    assert opt_in(auto, True) == "declined"
    # Asked for in so many words: the author's own choice.
    asked = gen.cronjob(
        "report",
        gen.with_annotations({"cronlock.io/stop": "signal"}),
        gen.containers(*probed),
        gen.service_account("reports"),
    )
    assert opt_in(asked, True) == "namespace"
    assert opt_in(gen.cronjob("report"), True) == "annotation", "annotated on default: guarded"
    message = declined_message(plain)
    assert 'annotate it cronlock.io/enabled: "true"' in message
    assert "ServiceAccount of its own" in message
    reading = read_config(plain, SETTINGS, Readings(labelled=["team-a"]))
    assert (reading.opt_in, reading.enabled, reading.config, reading.invalid) == (
        "declined",
        False,
        None,
        None,
    )


@pytest.mark.parametrize("labelled", [False, True])
def test_enabled_with_another_value_is_an_error_not_a_silent_no(labelled: bool) -> None:
    with pytest.raises(InvalidConfig) as caught:
        opt_in(
            gen.cronjob("report", gen.with_annotations({"cronlock.io/enabled": "True"})), labelled
        )
    assert caught.value.annotation == "cronlock.io/enabled"


def test_a_kept_reading_follows_its_namespaces_label_at_the_same_version() -> None:
    """The label is not part of the CronJob: labelling its namespace changes no
    resourceVersion of it, yet its reading changes, and back."""
    body = gen.cronjob(
        "report",
        gen.in_namespace("default"),
        gen.with_annotations({"cronlock.io/ttl": "90s"}),
        gen.service_account("reports"),
    )
    body["metadata"].update(uid="u-1", resourceVersion="7")
    readings = Readings()
    assert read_config(body, SETTINGS, readings).opt_in == "off"
    assert readings.set_labelled("default", True) is True
    assert readings.set_labelled("default", True) is False, "no change, nothing to redo"
    reading = read_config(body, SETTINGS, readings)
    assert (reading.opt_in, reading.enabled) == ("namespace", True)
    assert reading.config is not None
    assert reading.config.ttl_seconds == 90
    assert readings.labelled("other") is False
    readings.set_labelled("default", False)
    assert read_config(body, SETTINGS, readings).config is None
    # Readings that do not know the label (not the runtime's) read the CronJob as off.
    assert read_config(body, SETTINGS, Readings()).opt_in == "off"


STORES_SETTINGS = OperatorSettings(
    sidecar_image="ghcr.io/example/cronlock:1.0.0",
    sidecar_stores_image="ghcr.io/example/cronlock:1.0.0-stores",
)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (
            {"cronlock.io/store": "redis"},
            'cronlock.io/store: "redis" needs cronlock.io/store-secret',
        ),
        ({"cronlock.io/store": "etcd"}, 'cronlock.io/store: "etcd" is not one of lease, redis'),
        (
            {"cronlock.io/store": "lease", "cronlock.io/store-secret": "locks"},
            'cronlock.io/store-secret: "locks" names a store\'s Secret, but the lock is a Lease',
        ),
        (
            {"cronlock.io/store-secret": "locks"},
            'cronlock.io/store-secret: "locks" names a store\'s Secret, but the lock is a Lease',
        ),
        (
            {"cronlock.io/store": "postgres", "cronlock.io/store-secret": "Locks_DB"},
            'cronlock.io/store-secret: "Locks_DB" is not a Secret name',
        ),
        (
            {"cronlock.io/store": "redis", "cronlock.io/store-secret": "x" * 300},
            'cronlock.io/store-secret: "' + "x" * 253 + '" is not a Secret name',
        ),
    ],
)
def test_store_annotations_are_checked(annotations: dict[str, str], expected: str) -> None:
    cronjob = gen.cronjob("report", gen.annotated(annotations))
    with pytest.raises(InvalidConfig) as caught:
        parse_config(cronjob, STORES_SETTINGS)
    assert str(caught.value).startswith(expected)


@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_permits_above_one_in_a_store_are_the_stores_to_keep(store: str) -> None:
    """The stores' rules keep N permits (docs/DECISIONS.md, "Permits in a store")."""
    in_store = {"cronlock.io/store": store, "cronlock.io/store-secret": "locks"}
    cronjob = gen.cronjob("report", gen.annotated({**in_store, "cronlock.io/permits": "2"}))
    assert parse_config(cronjob, STORES_SETTINGS).permits == 2


@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_a_shared_store_without_the_stores_image_is_refused_not_quietly_a_lease(
    store: str,
) -> None:
    """Guarding a cross-cluster lock with this cluster's Lease would let runs overlap."""
    with pytest.raises(InvalidConfig) as caught:
        config_of({"cronlock.io/store": store, "cronlock.io/store-secret": "locks"})
    assert str(caught.value) == (
        f'cronlock.io/store: "{store}" needs the sidecar image with the store clients, which '
        "this operator was not given (flag --sidecar-stores-image, chart value "
        "sidecarStoresImage)"
    )


def test_the_stores_image_decides_whether_the_settings_lock_defaults_allow_a_store() -> None:
    """`--sidecar-images-from` swaps the images in after the flags (cli.py): the lock
    defaults a CronJob is read under follow the image, whatever `lock` said."""
    cronjob = gen.cronjob(
        "report", gen.annotated({"cronlock.io/store": "redis", "cronlock.io/store-secret": "s"})
    )
    asked = OperatorSettings(sidecar_image="img", lock=LockDefaults(stores_allowed=True))
    assert not asked.lock.stores_allowed
    with pytest.raises(InvalidConfig):
        parse_config(cronjob, asked.lock)
    given = dataclasses.replace(asked, sidecar_stores_image="stores")
    assert given.lock.stores_allowed
    assert parse_config(cronjob, given.lock) == parse_config(cronjob, given)
    assert not dataclasses.replace(given, sidecar_stores_image=None).stores_allowed


@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_a_shared_store_is_parsed(store: str) -> None:
    cronjob = gen.cronjob(
        "report",
        gen.annotated({"cronlock.io/store": store, "cronlock.io/store-secret": "team-locks"}),
    )
    config = parse_config(cronjob, STORES_SETTINGS)
    assert (config.store, config.store_secret, config.shared_store) == (store, "team-locks", True)


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {"cronlock.io/share-lock-with": "invoices, ledger"},
        {"cronlock.io/store": "redis", "cronlock.io/store-secret": "team-locks"},
    ],
)
def test_the_config_keeps_its_peers_and_where_its_lock_is_kept(
    annotations: dict[str, str],
) -> None:
    """Read once with the rest: what consent (leases/sharing.py) reads from a CronJob's
    annotations as written, for a valid CronJob the same."""
    cronjob = gen.cronjob("report", gen.annotated(annotations))
    config = parse_config(cronjob, STORES_SETTINGS)
    assert config.peers == parse_peers(annotations_of(cronjob))
    assert config.kept_in == where_kept(cronjob)
    assert config.peers == (
        {"invoices", "ledger"} if "cronlock.io/share-lock-with" in annotations else set()
    )


def test_the_lease_store_may_be_named() -> None:
    assert config_of({"cronlock.io/store": "lease"}) == config_of({})


def test_error_message_names_annotation_value_and_accepted_form() -> None:
    with pytest.raises(InvalidConfig) as caught:
        config_of({"cronlock.io/ttl": "abc"})
    assert str(caught.value) == (
        'cronlock.io/ttl: "abc" is not a duration; '
        "expected a Go duration such as 90s, 5m, 1h30m or 1.5s"
    )


def test_auto_stop_uses_liveness_unless_the_user_has_a_liveness_probe() -> None:
    assert config_of({}).stop == "liveness"
    assert config_of({}, gen.containers(*PROBED)).stop == "signal"
    assert config_of({"cronlock.io/stop": "signal"}).stop == "signal"


def test_auto_stop_sees_through_cronlocks_own_probe() -> None:
    cronjob = gen.cronjob("report")
    injected = build_injection(cronjob, parse_config(cronjob, SETTINGS), SETTINGS)
    assert parse_config(injected, SETTINGS) == parse_config(cronjob, SETTINGS)


def test_operator_owned_annotations_are_not_unknown() -> None:
    config = config_of(
        {
            "cronlock.io/original-restart-policy": "OnFailure",
            "cronlock.io/original-termination-grace-period-seconds": "unset",
            "cronlock.io/consecutive-skips": "2",
            "other.example.com/ttl": "whatever",
        }
    )
    assert config.ttl_seconds == 60


def test_default_renew_is_a_third_of_the_ttl_in_milliseconds() -> None:
    assert config_of({"cronlock.io/ttl": "100s"}).renew_seconds == 33.333


@pytest.mark.parametrize(
    ("ttl", "grace"), [(19, 2), (21, 2), (22, 3), (30, 5), (46, 10), (60, 10), (86400, 10)]
)
def test_kill_grace_fits_inside_the_ttl(ttl: int, grace: int) -> None:
    assert kill_grace_seconds(ttl, 2, f"{ttl}s") == grace


@pytest.mark.parametrize("skew", [0, 1, 2, 5])
def test_timing_is_safe_for_every_accepted_ttl(skew: int) -> None:
    for ttl in range(minimum_ttl_seconds(skew), 400):
        grace = kill_grace_seconds(ttl, skew, f"{ttl}s")
        assert grace >= 2  # the kubelet's own floor
        assert ttl * 2 / 3 + 1 + 1 + grace + skew < ttl
    with pytest.raises(InvalidConfig):
        kill_grace_seconds(minimum_ttl_seconds(skew) - 1, skew, "short")


@pytest.mark.parametrize(
    ("ttl", "timeout", "threshold"),
    [(19, 1, 1), (30, 1, 1), (51, 1, 1), (52, 2, 2), (57, 2, 2), (58, 3, 2), (86400, 3, 2)],
)
def test_the_probe_forgives_as_much_as_the_ttl_has_room_for(
    ttl: int, timeout: int, threshold: int
) -> None:
    config = config_of({"cronlock.io/ttl": f"{ttl}s"})
    assert config.probe == ProbeTolerance(timeout, threshold)
    probe = build_injection(
        gen.cronjob("report", gen.with_annotations({"cronlock.io/ttl": f"{ttl}s"})),
        config,
        SETTINGS,
    )["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    assert (probe["timeoutSeconds"], probe["failureThreshold"]) == (timeout, threshold)


@pytest.mark.parametrize("skew", [0, 1, 2, 5])
def test_the_probe_and_the_kill_grace_stop_a_run_before_its_lease_can_be_taken(
    skew: int,
) -> None:
    # The kubelet sees a lost lease at most one period, then `threshold` probes each failing
    # within max(timeout, period), after the renew deadline; with the kill grace and the
    # skew that must end strictly before the ttl. And no more forgiving probe would fit.
    for ttl in range(minimum_ttl_seconds(skew), 400):
        grace = kill_grace_seconds(ttl, skew, f"{ttl}s")
        chosen = probe_tolerance(ttl, skew, grace)
        assert chosen in PROBE_TOLERANCES
        detection = 1 + chosen.failure_threshold * max(chosen.timeout_seconds, 1)
        assert ttl * 2 / 3 + detection + grace + skew < ttl
        for better in PROBE_TOLERANCES[: PROBE_TOLERANCES.index(chosen)]:
            more = 1 + better.failure_threshold * max(better.timeout_seconds, 1)
            assert not ttl * 2 / 3 + more + grace + skew < ttl
    assert PROBE_TOLERANCES[-1] == ProbeTolerance(1, 1)  # what the kill grace assumes


def test_too_short_ttl_says_the_minimum() -> None:
    with pytest.raises(InvalidConfig) as caught:
        config_of({"cronlock.io/ttl": "18s"})
    assert caught.value.annotation == "cronlock.io/ttl"
    assert "at least 19s" in str(caught.value)
    assert config_of({"cronlock.io/ttl": "19s"}).kill_grace_seconds == 2


def test_settings_defaults_apply_and_a_users_ttl_brings_its_own_renew() -> None:
    settings = OperatorSettings(
        sidecar_image="img",
        lock=LockDefaults(default_ttl_seconds=120, default_renew_seconds=15, default_policy="wait"),
    )
    cronjob = gen.cronjob("report")
    assert parse_config(cronjob, settings).ttl_seconds == 120
    assert parse_config(cronjob, settings).renew_seconds == 15
    assert parse_config(cronjob, settings).policy == "wait"
    cronjob["metadata"]["annotations"]["cronlock.io/ttl"] = "30s"
    assert parse_config(cronjob, settings).renew_seconds == 10


@pytest.mark.parametrize(
    ("changes", "lock"),
    [
        ({"sidecar_image": ""}, {}),
        ({"sidecar_image_pull_policy": "Sometimes"}, {}),
        ({}, {"default_ttl_seconds": 10}),
        ({}, {"default_ttl_seconds": 60, "default_renew_seconds": 30}),
        ({}, {"skew_seconds": -1}),
        ({}, {"default_policy": "queue"}),
    ],
)
def test_bad_operator_settings_fail_at_startup(
    changes: dict[str, Any], lock: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match=r"\w"):
        OperatorSettings(**{"sidecar_image": "img", **changes}, lock=LockDefaults(**lock))


@pytest.mark.parametrize(
    ("annotations", "cronjob", "annotation", "reason"),
    BAD,
    ids=[
        f"{case[2].removeprefix('cronlock.io/')}={next(iter(case[0].values()))!r}" for case in BAD
    ],
)
def test_bad_annotation_is_refused_by_name(
    annotations: dict[str, str], cronjob: tuple[gen.Modifier, ...], annotation: str, reason: str
) -> None:
    with pytest.raises(InvalidConfig) as caught:
        config_of(annotations, *cronjob)
    assert caught.value.annotation == annotation
    assert str(caught.value).startswith(annotation)
    assert reason in str(caught.value)


def test_a_cronjob_name_that_is_no_lock_name_is_refused_on_the_lock_annotation() -> None:
    with pytest.raises(InvalidConfig) as caught:
        parse_config(gen.cronjob("x" * 64), SETTINGS)
    assert caught.value.annotation == "cronlock.io/lock"
    assert "the CronJob's name" in str(caught.value)


@pytest.mark.parametrize(
    ("annotations", "seconds"),
    [
        ({}, 0.0),
        ({"cronlock.io/max-hold": "0"}, 0.0),
        ({"cronlock.io/max-hold": "0", "cronlock.io/policy": "observe"}, 0.0),
        ({"cronlock.io/max-hold": "40s"}, 40.0),  # 2 renew periods of the default 60s ttl
        ({"cronlock.io/ttl": "19s", "cronlock.io/renew": "5s", "cronlock.io/max-hold": "10s"}, 10),
        ({"cronlock.io/max-hold": "168h"}, 7 * 24 * 3600.0),
    ],
)
def test_max_hold_is_read_with_its_bounds(annotations: dict[str, str], seconds: float) -> None:
    assert config_of(annotations).max_hold_seconds == seconds


def test_a_huge_max_hold_is_refused_not_a_crash() -> None:
    with pytest.raises(InvalidConfig) as refused:
        config_of({"cronlock.io/max-hold": "9" * 400 + "h"})
    assert "is out of range; expected at most 168h" in str(refused.value)


def test_max_hold_below_two_renewals_says_the_shortest_it_allows() -> None:
    with pytest.raises(InvalidConfig) as refused:
        config_of({"cronlock.io/ttl": "19s", "cronlock.io/max-hold": "12s"})
    assert str(refused.value) == (
        'cronlock.io/max-hold: "12s" is shorter than 2 renew periods (12.666s with a renew '
        "period of 6.333s); expected at least 12.666s, or 0 for no bound"
    )


@pytest.mark.parametrize(
    ("annotations", "permits"),
    [({}, 1), ({"cronlock.io/permits": "1"}, 1), ({"cronlock.io/permits": "3"}, 3),
     ({"cronlock.io/permits": " 16 "}, 16)],
)  # fmt: skip
def test_permits_say_how_many_runs_may_hold_the_lock_at_once(
    annotations: dict[str, str], permits: int
) -> None:
    assert config_of(annotations).permits == permits


@pytest.mark.parametrize("policy", ["skip", "wait", "replace", "observe"])
def test_every_policy_is_accepted(policy: str) -> None:
    assert config_of({"cronlock.io/policy": policy}).policy == policy


def test_replace_waits_for_the_holder_ttl_plus_skew_plus_renew_unless_told() -> None:
    config = config_of({"cronlock.io/policy": "replace", "cronlock.io/ttl": "30s"})
    assert config.wait_timeout_seconds == 30 + 2 + 10
    told = config_of({"cronlock.io/policy": "replace", "cronlock.io/wait-timeout": "5s"})
    assert told.wait_timeout_seconds == 5
    assert config_of({"cronlock.io/policy": "observe"}).wait_timeout_seconds == 0


# --- read_config: the one reading, once per resourceVersion ------------------------------


def stored(uid: str, version: str = "1", annotations: dict[str, str] | None = None) -> Any:
    """A CronJob as the API server (and so the operator's cache) has it: uid and version."""
    return gen.cronjob(
        "report",
        *([] if annotations is None else [gen.with_annotations(annotations)]),
        gen.with_uid(uid),
        gen.with_metadata(resourceVersion=version),
        gen.as_stored(),
    )


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The uids parse_config was called for, with an empty memo."""
    calls: list[str] = []
    real = reading_module.parse_config

    def counting(cronjob: Any, settings: OperatorSettings) -> LockConfig:
        calls.append(str(cronjob["metadata"].get("uid")))
        return real(cronjob, settings)

    monkeypatch.setattr(reading_module, "parse_config", counting)
    return calls


@pytest.fixture
def memo() -> Readings:
    """The readings a runtime keeps, empty."""
    return Readings()


def test_a_resource_version_is_parsed_once_and_a_new_one_again(
    parses: list[str], memo: Readings
) -> None:
    body = stored("uid-once")
    first = read_config(body, SETTINGS, memo)
    assert read_config(body, SETTINGS, memo) is first
    assert (
        read_config(stored("uid-once"), SETTINGS, memo) is first
    )  # another copy, the same version
    assert counting_settings(body, SETTINGS, memo) == (3, False)
    assert parses == ["uid-once"]

    newer = stored("uid-once", "2")
    assert read_config(newer, SETTINGS, memo) is not first
    assert read_config(newer, SETTINGS, memo) is read_config(newer, SETTINGS, memo)
    assert parses == ["uid-once", "uid-once"]
    # Under other settings a version is another reading.
    assert read_config(newer, NEW_SETTINGS, memo) is not read_config(newer, SETTINGS, memo)
    assert len(parses) == 3


def test_the_module_keeps_no_readings_of_its_own(parses: list[str]) -> None:
    """The module keeps no state of its own: the runtime owns the memo and passes it in, so
    two readers given two memos parse twice."""
    body = stored("uid-pure")
    assert read_config(body, SETTINGS, Readings()) == read_config(body, SETTINGS, Readings())
    assert parses == ["uid-pure", "uid-pure"]
    assert not any(isinstance(value, Readings) for value in vars(reading_module).values())


def test_an_invalid_version_is_kept_too_without_its_traceback(
    parses: list[str], memo: Readings
) -> None:
    body = stored("uid-bad", annotations={"cronlock.io/enabled": "true", "cronlock.io/ttl": "x"})
    reading = read_config(body, SETTINGS, memo)
    assert read_config(body, SETTINGS, memo) is reading
    assert parses == ["uid-bad"]
    assert reading.invalid is not None
    assert reading.invalid.__traceback__ is None
    assert reading.invalid.__context__ is None


def test_a_body_without_uid_or_version_is_parsed_each_time(
    parses: list[str], memo: Readings
) -> None:
    body = gen.cronjob("report")
    assert read_config(body, SETTINGS, memo) == read_config(body, SETTINGS, memo)
    no_version = stored("uid-x")
    del no_version["metadata"]["resourceVersion"]
    read_config(no_version, SETTINGS, memo)
    read_config(no_version, SETTINGS, memo)
    assert len(parses) == 4
    assert len(memo) == 0


def test_an_edit_is_read_under_its_new_version(parses: list[str], memo: Readings) -> None:
    """The API server gives every edit a new resourceVersion: that is what is read anew."""
    body = stored("uid-edited")
    assert read_config(body, SETTINGS, memo).config is not None
    body["metadata"]["annotations"]["cronlock.io/ttl"] = "nonsense"
    assert read_config(changed(body), SETTINGS, memo).invalid is not None
    body["metadata"]["annotations"]["cronlock.io/ttl"] = "60s"
    body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"] = PROBED
    reading = read_config(changed(body), SETTINGS, memo)
    assert reading.config is not None
    assert reading.config.stop == "signal"
    assert read_config(body, SETTINGS, memo) is reading
    assert len(parses) == 3


def test_the_memo_keeps_the_latest_version_of_a_bounded_number_of_cronjobs(
    parses: list[str],
) -> None:
    memo = Readings(limit=2)
    a, b, c = stored("uid-a"), stored("uid-b"), stored("uid-c")
    read_config(a, SETTINGS, memo)
    read_config(b, SETTINGS, memo)
    read_config(a, SETTINGS, memo)  # a is used again: b goes first
    read_config(c, SETTINGS, memo)
    assert len(memo) == 2
    read_config(a, SETTINGS, memo)
    read_config(b, SETTINGS, memo)
    assert parses == ["uid-a", "uid-b", "uid-c", "uid-b"]
    read_config(stored("uid-b", "2"), SETTINGS, memo)  # replaces b's version 1, takes no new place
    assert len(memo) == 2


def test_the_operators_worker_threads_all_get_the_one_reading(
    parses: list[str], memo: Readings
) -> None:
    bodies = [stored(f"uid-{index}") for index in range(50)]
    seen: list[list[ConfigReading]] = [[] for _ in bodies]
    start = threading.Barrier(4)

    def worker() -> None:
        start.wait()
        for index, body in enumerate(bodies):
            seen[index].append(read_config(body, SETTINGS, memo))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for readings in seen:
        assert len(readings) == 4
        assert all(reading is readings[0] for reading in readings)


def test_the_reading_of_a_valid_cronjob_carries_its_config() -> None:
    body = gen.cronjob(
        "report",
        gen.annotated(
            {
                "cronlock.io/lock": "shared",
                "cronlock.io/policy": "observe",
                "cronlock.io/alert-after": "5",
                "cronlock.io/keep-skipped-jobs": "true",
            }
        ),
    )
    reading = read_config(body, SETTINGS, Readings())
    assert reading.config == parse_config(body, SETTINGS)
    assert reading == ConfigReading(
        enabled=True,
        config=reading.config,
        invalid=None,
        alert_after=5,
        alert_after_missed=3,
        keep_skipped_jobs=True,
        lock="shared",
        policy="observe",
        opt_in="annotation",
    )


@pytest.mark.parametrize(
    ("annotations", "enabled", "invalid"),
    [
        ({}, False, None),
        ({"cronlock.io/enabled": "false", "cronlock.io/ttl": "nonsense"}, False, None),
        ({"cronlock.io/enabled": "True"}, False, "cronlock.io/enabled"),
        ({"cronlock.io/enabled": "true", "cronlock.io/ttl": "nonsense"}, True, "cronlock.io/ttl"),
        ({"cronlock.io/enabled": "true", "cronlock.io/tll": "60s"}, True, "cronlock.io/tll"),
    ],
)
def test_one_rule_for_a_cronjob_that_is_not_guarded(
    annotations: dict[str, str], enabled: bool, invalid: str | None
) -> None:
    """Guarded only when opted in and valid; else `invalid` says why, or is None when it
    did not opt in (the other annotations of an unguarded CronJob are not checked)."""
    reading = read_config(
        gen.cronjob("report", gen.with_annotations(annotations)), SETTINGS, Readings()
    )
    assert reading.config is None
    assert reading.enabled is enabled
    assert (reading.invalid.annotation if reading.invalid else None) == invalid


@pytest.mark.parametrize(
    ("annotations", "alert_after", "keep", "policy", "lock"),
    [
        # An unrelated bad annotation changes none of the others.
        ({"cronlock.io/alert-after": "2", "cronlock.io/keep-skipped-jobs": "true"}, 2, True,
         "skip", "report"),
        ({"cronlock.io/policy": "wait", "cronlock.io/lock": "shared"}, 3, False, "wait",
         "shared"),
        # A bad one itself falls back to its own default only.
        ({"cronlock.io/alert-after": "0", "cronlock.io/keep-skipped-jobs": "true"}, 3, True,
         "skip", "report"),
        ({"cronlock.io/alert-after": "2", "cronlock.io/keep-skipped-jobs": "yes"}, 2, False,
         "skip", "report"),
        ({"cronlock.io/policy": "replce"}, 3, False, "invalid", "report"),
    ],
)  # fmt: skip
def test_an_invalid_config_is_counted_and_shown_by_each_annotation_on_its_own(
    annotations: dict[str, str], alert_after: int, keep: bool, policy: str, lock: str
) -> None:
    cronjob = gen.cronjob("report", gen.annotated({"cronlock.io/ttl": "nonsense", **annotations}))
    reading = read_config(cronjob, SETTINGS, Readings())
    assert reading.invalid is not None
    assert (reading.alert_after, reading.keep_skipped_jobs) == (alert_after, keep)
    assert (reading.policy, reading.lock) == (policy, lock)
