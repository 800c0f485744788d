"""Who may use a lock: the rule, without an API server."""

from __future__ import annotations

from typing import Any

import pytest

from cronlock_operator.leases.sharing import Consent, InvalidPeers, consent, parse_peers
from tests.support import gen
from tests.support.leases import make_lease


def sharing_with(names: str) -> gen.Modifier:
    return gen.annotated({"cronlock.io/share-lock-with": names})


def lease(*users: tuple[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Lock ledger's Lease in ns, used by `users` (name, uid); `labels` as make_lease's."""
    return make_lease(lock="ledger", namespace="ns", owners=users, labels=labels)


def lookup(*bodies: dict[str, Any]) -> Any:
    by_name = {body["metadata"]["name"]: body for body in bodies}
    return by_name.get


def test_a_lock_nobody_uses_and_one_the_cronjob_already_uses_are_its_own() -> None:
    me = gen.cronjob("report", gen.with_uid("u-report"))
    assert consent(None, me, "ledger", lookup()) == Consent("create")
    assert consent(lease(), me, "ledger", lookup()) == Consent("join")
    assert consent(lease(("report", "u-report")), me, "ledger", lookup()) == Consent("owned")
    shared = lease(("report", "u-report"), ("export", "u-export"))
    assert consent(shared, me, "ledger", lookup()) == Consent("owned")
    # Made before the lock label existed: its users join (the patch adds the label).
    unlabelled = lease(("report", "u-report"), labels={"app.kubernetes.io/managed-by": "cronlock"})
    assert consent(unlabelled, me, "ledger", lookup()) == Consent("join")


def test_a_lease_cronlock_did_not_make_or_made_for_another_lock_is_refused() -> None:
    me = gen.cronjob("report", gen.with_uid("u-report"))
    foreign = consent(lease(("report", "u-report"), labels={}), me, "ledger", lookup())
    assert foreign.verdict == "refused"
    assert "lease ns/cronlock-ledger exists and lacks the label" in foreign.reason
    other = lease(labels={"app.kubernetes.io/managed-by": "cronlock", "cronlock.io/lock": "x"})
    refused = consent(other, me, "ledger", lookup())
    assert (refused.verdict, refused.granted) == ("refused", False)
    assert "is labelled for lock x" in refused.reason


def test_joining_a_used_lock_needs_a_user_naming_the_joiner() -> None:
    # Her own consent counts for nothing.
    me = gen.cronjob("squat", gen.with_uid("u-squat"), sharing_with("invoices,squat"))
    used = lease(("invoices", "u-inv"))
    refused = consent(used, me, "ledger", lookup(gen.cronjob("invoices", gen.with_uid("u-inv"))))
    assert refused.verdict == "refused"
    assert refused.reason.startswith("lock ledger is already used by CronJob invoices")
    named = lookup(gen.cronjob("invoices", gen.with_uid("u-inv"), sharing_with("report, squat")))
    assert consent(used, me, "ledger", named) == Consent("join")


def test_a_user_not_seen_or_replaced_under_its_name_gives_no_consent_and_no_verdict_yet() -> None:
    """Most likely deleted, its reference not yet dropped by the garbage collector."""
    me = gen.cronjob("squat", gen.with_uid("u-squat"))
    used = lease(("invoices", "u-old"))
    renamed = lookup(gen.cronjob("invoices", gen.with_uid("u-new"), sharing_with("squat")))
    replaced = consent(used, me, "ledger", renamed)
    assert replaced.verdict == "undecided"
    assert "names CronJob invoices, not (yet) seen" in replaced.reason
    assert consent(used, me, "ledger", lookup()).verdict == "undecided"
    assert not replaced.granted
    # One that is seen and consents is enough, whoever else is unseen.
    both = lease(("invoices", "u-inv"), ("gone", "u-gone"))
    seen = lookup(gen.cronjob("invoices", gen.with_uid("u-inv"), sharing_with("squat")))
    assert consent(both, me, "ledger", seen).granted


def test_a_malformed_share_list_consents_to_nobody() -> None:
    me = gen.cronjob("squat", gen.with_uid("u-squat"))
    used = lease(("invoices", "u-inv"))
    malformed = lookup(gen.cronjob("invoices", gen.with_uid("u-inv"), sharing_with("squat,X")))
    verdict = consent(used, me, "ledger", malformed)
    assert verdict.verdict == "refused"


@pytest.mark.parametrize(
    ("text", "names"),
    [("a", {"a"}), ("a, b.c ,d-1", {"a", "b.c", "d-1"})],
)
def test_share_lists_parse(text: str, names: set[str]) -> None:
    assert parse_peers({"cronlock.io/share-lock-with": text}) == names


@pytest.mark.parametrize("text", ["", "a,,b", "A", "a_b", "x" * 53, ",".join(["a"] * 101)])
def test_malformed_share_lists_are_refused(text: str) -> None:
    with pytest.raises(InvalidPeers):
        parse_peers({"cronlock.io/share-lock-with": text})


def test_one_lock_name_is_never_kept_in_two_places() -> None:
    """A CronJob keeping lock ledger in Redis cannot join the users who keep it in the Lease
    (or in another store or Secret), even with their consent: the runs would never see
    each other (security review H1)."""
    used = lease(("invoices", "u-inv"))
    inv = gen.cronjob("invoices", gen.with_uid("u-inv"), sharing_with("squat"))
    me = gen.cronjob("squat", gen.with_uid("u-squat"))
    me["metadata"]["annotations"].update(
        {"cronlock.io/store": "redis", "cronlock.io/store-secret": "team-locks"}
    )
    refused = consent(used, me, "ledger", lookup(inv))
    assert refused.verdict == "refused"
    assert refused.reason.startswith(
        "lock ledger is kept in the Lease by CronJob invoices; this CronJob asks for redis "
        "(Secret team-locks)"
    )
    inv["metadata"]["annotations"].update(
        {"cronlock.io/store": "redis", "cronlock.io/store-secret": "other-locks"}
    )
    assert consent(used, me, "ledger", lookup(inv)).verdict == "refused"
    inv["metadata"]["annotations"]["cronlock.io/store-secret"] = "team-locks"
    assert consent(used, me, "ledger", lookup(inv)) == Consent("join")


def permits(count: str) -> gen.Modifier:
    return gen.annotated({"cronlock.io/permits": count})


def counted(count: int, *users: tuple[str, str]) -> dict[str, Any]:
    """Lock ledger's Lease, used by `users`, saying the lock has `count` permits."""
    notes = {} if count == 1 else {"cronlock.io/permits": str(count)}
    return make_lease(lock="ledger", namespace="ns", owners=users, annotations=notes)


def test_every_cronjob_sharing_a_lock_asks_the_same_permits() -> None:
    report = gen.cronjob("report", gen.with_uid("u-report"), permits("2"))
    export = gen.cronjob("export", gen.with_uid("u-export"), permits("2"))
    both = counted(2, ("report", "u-report"), ("export", "u-export"))
    assert consent(both, report, "ledger", lookup(export)) == Consent("owned")
    # Export asks 3 while report still asks the lock's 2: export is refused, report not.
    three = gen.cronjob("export", gen.with_uid("u-export"), permits("3"))
    refused = consent(both, three, "ledger", lookup(report))
    assert refused.verdict == "refused"
    assert refused.reason.startswith("lock ledger has 2 permits, as CronJob report asks")
    assert "Set it to 2 here, or to 3 on report as well" in refused.reason
    assert consent(both, report, "ledger", lookup(three)) == Consent("owned")
    # Once report asks 3 too, the last one to agree may write it.
    report_three = gen.cronjob("report", gen.with_uid("u-report"), permits("3"))
    assert consent(both, report_three, "ledger", lookup(three)) == Consent("owned")
    assert consent(both, three, "ledger", lookup(report_three)) == Consent("owned")


def test_a_joiner_asking_other_permits_than_the_lock_is_refused_even_with_consent() -> None:
    invoices = gen.cronjob("invoices", gen.with_uid("u-inv"), sharing_with("report"))
    me = gen.cronjob("report", gen.with_uid("u-report"), permits("4"))
    refused = consent(counted(1, ("invoices", "u-inv")), me, "ledger", lookup(invoices))
    assert refused.verdict == "refused"
    assert "lock ledger has 1 permit, as CronJob invoices asks" in refused.reason
    # Absent on both is 1 on both; "1" written out is the same.
    plain = gen.cronjob("report", gen.with_uid("u-report"), permits("1"))
    assert consent(counted(1, ("invoices", "u-inv")), plain, "ledger", lookup(invoices)) == (
        Consent("join")
    )


def test_a_lone_user_changes_its_locks_permits_and_unseen_or_bad_users_do_not_hold_it() -> None:
    me = gen.cronjob("report", gen.with_uid("u-report"), permits("5"))
    assert consent(counted(2, ("report", "u-report")), me, "ledger", lookup()) == (Consent("owned"))
    # A user asking a bad value (its own reconcile refuses it) or replaced under its name
    # (another uid) holds the lock's N for nobody.
    bad = gen.cronjob("export", gen.with_uid("u-export"), permits("zero"))
    replaced = gen.cronjob("export", gen.with_uid("u-new"), permits("2"))
    used = counted(2, ("report", "u-report"), ("export", "u-export"))
    assert consent(used, me, "ledger", lookup(bad)) == Consent("owned")
    assert consent(used, me, "ledger", lookup(replaced)) == Consent("owned")
