"""Who may use a lock: the CronJobs that already use it, and those they name.

A CronJob editor chooses her CronJob's lock, so without a rule she could point it at
another team's lock and have her ServiceAccount granted that team's Lease. The rule: a
CronJob may use a lock nobody uses yet, one it already uses (it owns the Lease), or one
whose users include a CronJob naming it in `cronlock.io/share-lock-with`. That consent
lives on a CronJob the joiner's editor may not be able to edit, so she cannot forge it.

`consent` judges it from the Lease as read and returns a value; the executor acts on it
(create, join, or refuse with its reason) and the adapter only sends the writes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, NamedTuple

from cronlock_operator.leases.ownership import foreign_lease, lease_is_ours
from cronlock_sidecar import contract
from cronlock_sidecar.lock.permits import permits_of, read_count

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_PEERS: Final = 100
MAX_NAME_LENGTH: Final = 52  # a CronJob's name is at most 52 characters

# A cached CronJob by name, or None when the operator has not seen it.
CronJobLookup = Callable[[str], Mapping[str, Any] | None]


class InvalidPeers(ValueError):
    """`cronlock.io/share-lock-with` is not a list of CronJob names."""


def parse_peers(annotations: Mapping[str, str]) -> frozenset[str]:
    """The CronJob names in `cronlock.io/share-lock-with` (empty when absent)."""
    text = annotations.get(contract.ANNOTATION_SHARE_LOCK_WITH)
    if text is None:
        return frozenset()
    names = [part.strip() for part in text.split(",")]
    if len(names) > MAX_PEERS:
        raise InvalidPeers(f"names more than {MAX_PEERS} CronJobs")
    for name in names:
        if len(name) > MAX_NAME_LENGTH or not _NAME.fullmatch(name):
            shown = name if len(name) <= 80 else name[:80] + "..."
            raise InvalidPeers(
                f"has {shown!r}, which is not a CronJob name; expected CronJob names of this "
                "namespace, separated by commas"
            )
    return frozenset(names)


def lease_users(lease: Mapping[str, Any]) -> dict[str, str]:
    """The CronJobs (uid -> name) the Lease's owner references name."""
    owners = (lease.get("metadata") or {}).get("ownerReferences")
    users: dict[str, str] = {}
    for owner in owners if isinstance(owners, list) else []:
        if isinstance(owner, Mapping) and owner.get("kind") == "CronJob":
            users[str(owner.get("uid"))] = str(owner.get("name"))
    return users


def where_kept(cronjob: Mapping[str, Any]) -> tuple[str, str]:
    """Where a CronJob's lock lives, as its annotations say: (store, Secret), ("lease", "")
    for the Lease itself. Read as written: its own reconcile judges whether it is valid."""
    notes = (cronjob.get("metadata") or {}).get("annotations") or {}
    store = str(notes.get(contract.ANNOTATION_STORE, "lease"))
    return (
        (store, "")
        if store == "lease"
        else (store, str(notes.get(contract.ANNOTATION_STORE_SECRET, "")))
    )


def _describe(kept: tuple[str, str]) -> str:
    store, secret = kept
    return "the Lease" if store == "lease" else f"{store} (Secret {secret})"


class Consent(NamedTuple):
    """What a CronJob may do about the Lease of the lock it names, judged from that Lease.

    - `create`: no Lease (as far as the reader knows): create it;
    - `owned`: the Lease is cronlock's, for this lock, and the CronJob already uses it;
    - `join`: the CronJob may use it and is not (fully) written into it yet;
    - `refused`: it may not (a Lease cronlock did not make, or nobody consents): `reason`
      says why and what to do;
    - `undecided`: a user the operator has not seen yet might consent: look again later.
    """

    verdict: Literal["create", "owned", "join", "refused", "undecided"]
    reason: str = ""

    @property
    def granted(self) -> bool:
        return self.verdict in ("create", "owned", "join")


def consent(
    lease: Mapping[str, Any] | None, cronjob: Mapping[str, Any], lock: str, cached: CronJobLookup
) -> Consent:
    """Whether `cronjob` may use the lock whose Lease is `lease` (None: none seen): a user it
    may be (`_consent`) that asks the lock's N permits, or the only one still asking it."""
    given = _consent(lease, cronjob, lock, cached)
    if lease is not None and given.granted:
        conflict = permits_conflict(lease, cronjob, lock, cached)
        if conflict is not None:
            return Consent("refused", conflict)
    return given


def asked_permits(cronjob: Mapping[str, Any]) -> int | None:
    """The N a CronJob asks (`cronlock.io/permits`, absent 1); None for a bad value, which
    its own reconcile refuses."""
    notes = (cronjob.get("metadata") or {}).get("annotations") or {}
    text = notes.get(contract.ANNOTATION_PERMITS)
    return 1 if text is None else read_count(text)


def permits_conflict(
    lease: Mapping[str, Any], cronjob: Mapping[str, Any], lock: str, cached: CronJobLookup
) -> str | None:
    """Why `cronjob` may not (yet) use the lock for the N it asks (None: it may).

    The lock's N is what its Lease says. A user asking another N changes it only once no
    other user (as cached) still asks the Lease's N: so changing N means annotating every
    CronJob of the lock, the last one writes it, and two users never flip it back and forth.
    """
    mine, current = asked_permits(cronjob), permits_of(lease)
    if mine is None or mine == current:
        return None
    uid = cronjob["metadata"]["uid"]
    agreeing = sorted(
        user
        for user_uid, user in lease_users(lease).items()
        if user_uid != uid
        and (body := cached(user)) is not None
        and body["metadata"].get("uid") == user_uid
        and asked_permits(body) == current
    )
    if not agreeing:
        return None
    names = ", ".join(agreeing)
    return (
        f"lock {lock} has {current} permit{'s' if current != 1 else ''}, as CronJob {names} "
        f"asks ({contract.ANNOTATION_PERMITS}); this CronJob asks for {mine}: every CronJob "
        f"sharing a lock asks the same {contract.ANNOTATION_PERMITS}. Set it to {current} "
        f"here, or to {mine} on {names} as well (docs/USAGE.md, Permits)"
    )


def _consent(
    lease: Mapping[str, Any] | None, cronjob: Mapping[str, Any], lock: str, cached: CronJobLookup
) -> Consent:
    """Whether `cronjob` may use the lock whose Lease is `lease` (None: none seen), its
    permits aside.

    A user the operator has not seen (gone, or replaced under the same name) gives no
    consent; while one is left and nobody consents, it is `undecided`, not a refusal: the
    garbage collector removes that reference soon, and the next try decides.
    """
    if lease is None:
        return Consent("create")
    metadata = cronjob["metadata"]
    name, uid = metadata["name"], metadata["uid"]
    if lease_is_ours(lease, uid, lock):
        return Consent("owned")
    foreign = foreign_lease(lease, lock)
    if foreign is not None:
        return Consent("refused", foreign)
    users = lease_users(lease)
    others = {user_uid: user for user_uid, user in users.items() if user_uid != uid}
    if uid in users or not others:
        return Consent("join")
    unseen = []
    mine = where_kept(cronjob)
    for user_uid, user in others.items():
        body = cached(user)
        if body is None or body["metadata"].get("uid") != user_uid:
            unseen.append(user)
            continue
        theirs = where_kept(body)
        if theirs != mine:
            # One lock name, two places: their runs and ours would never see each other.
            return Consent(
                "refused",
                f"lock {lock} is kept in {_describe(theirs)} by CronJob {user}; this CronJob "
                f"asks for {_describe(mine)}: a shared lock needs the same "
                f"{contract.ANNOTATION_STORE} and {contract.ANNOTATION_STORE_SECRET} on every "
                f"CronJob that uses it, or set {contract.ANNOTATION_LOCK} to a lock of its own",
            )
        try:
            if name in parse_peers(body["metadata"].get("annotations") or {}):
                return Consent("join")
        except InvalidPeers:
            continue
    if unseen:
        # Most likely deleted: the garbage collector drops its reference (or the Lease
        # with its last owner) soon. Until then, no consent and no verdict either.
        return Consent(
            "undecided",
            f"lock {lock}: its Lease names CronJob {', '.join(sorted(unseen))}, not (yet) "
            "seen by the operator",
        )
    named = ", ".join(sorted(others.values()))
    return Consent(
        "refused",
        f"lock {lock} is already used by CronJob {named}; a CronJob may share a lock only "
        f"when one that uses it names it: add {contract.ANNOTATION_SHARE_LOCK_WITH}: {name} "
        f"to {sorted(others.values())[0]}, or set {contract.ANNOTATION_LOCK} to a lock of "
        "its own",
    )
