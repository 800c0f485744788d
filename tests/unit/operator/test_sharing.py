"""Who may use a lock: the rule, without an API server."""

from __future__ import annotations

from typing import Any

import pytest

from cronlock_operator.errors import NotOurs, Retry
from cronlock_operator.lock.sharing import InvalidPeers, parse_peers, refuse_unshared_lock


def cronjob(name: str, uid: str, share: str | None = None) -> dict[str, Any]:
    annotations = {} if share is None else {"cronlock.io/share-lock-with": share}
    return {"metadata": {"name": name, "uid": uid, "annotations": annotations}}


def lease(*users: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "cronlock-ledger",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "name": name, "uid": uid}
                for name, uid in users
            ],
        }
    }


def lookup(*bodies: dict[str, Any]) -> Any:
    by_name = {body["metadata"]["name"]: body for body in bodies}
    return by_name.get


def test_a_lock_nobody_uses_and_one_the_cronjob_already_uses_are_its_own() -> None:
    me = cronjob("report", "u-report")
    refuse_unshared_lock(lease(), me, "ledger", lookup())
    refuse_unshared_lock(lease(("report", "u-report")), me, "ledger", lookup())
    refuse_unshared_lock(
        lease(("report", "u-report"), ("export", "u-export")), me, "ledger", lookup()
    )


def test_joining_a_used_lock_needs_a_user_naming_the_joiner() -> None:
    me = cronjob("squat", "u-squat", share="invoices,squat")  # her own consent counts for nothing
    used = lease(("invoices", "u-inv"))
    with pytest.raises(NotOurs, match="lock ledger is already used by CronJob invoices"):
        refuse_unshared_lock(used, me, "ledger", lookup(cronjob("invoices", "u-inv")))
    refuse_unshared_lock(
        used, me, "ledger", lookup(cronjob("invoices", "u-inv", share="report, squat"))
    )


def test_a_user_not_seen_or_replaced_under_its_name_gives_no_consent_and_no_verdict_yet() -> None:
    """Most likely deleted, its reference not yet dropped by the garbage collector: Retry."""
    me = cronjob("squat", "u-squat")
    used = lease(("invoices", "u-old"))
    with pytest.raises(Retry, match="names CronJob invoices, not \\(yet\\) seen"):
        refuse_unshared_lock(used, me, "ledger", lookup(cronjob("invoices", "u-new", "squat")))
    with pytest.raises(Retry):
        refuse_unshared_lock(used, me, "ledger", lookup())
    # One that is seen and consents is enough, whoever else is unseen.
    both = lease(("invoices", "u-inv"), ("gone", "u-gone"))
    refuse_unshared_lock(both, me, "ledger", lookup(cronjob("invoices", "u-inv", "squat")))


def test_a_malformed_share_list_consents_to_nobody() -> None:
    me = cronjob("squat", "u-squat")
    used = lease(("invoices", "u-inv"))
    with pytest.raises(NotOurs):
        refuse_unshared_lock(used, me, "ledger", lookup(cronjob("invoices", "u-inv", "squat,X")))


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
