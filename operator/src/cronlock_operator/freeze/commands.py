"""Freeze a lock for maintenance, and thaw it.

A freeze lives on the lock's Lease as three annotations (cronlock_sidecar.contract:
`frozen-until`, `frozen-by`, `frozen-reason`). Every run that starts on the lock while
`now < frozen-until` (on its own wall clock) skips before its work with one line saying
until when, by whom and why (cronlock_sidecar.holding.lease); a run already working is
left alone. A freeze ends by itself at its time: nothing has to be running to end it.

Who froze it is the API server's name for the caller (a SelfSubjectReview), and the
chart's `lease-freeze` policy checks both: only a caller allowed the verb `freeze` on
the Lease may change these annotations, and `frozen-by` must be its own name.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import kubernetes

from cronlock_operator.kube import errors
from cronlock_operator.kube.answers import answered
from cronlock_operator.storeaccess import StoreAccessError, address, open_store, store_url
from cronlock_sidecar import contract
from cronlock_sidecar.lock.durations import DurationError, parse_duration
from cronlock_sidecar.lock.model import read_lease
from cronlock_sidecar.microtime import MicroTimeError, format_microtime, parse_microtime
from cronlock_sidecar.transport.seam import ApiError, Conflict, LeaseRef, NotFound

EXIT_OK: Final = 0
EXIT_NOT_FOUND: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = contract.EXIT_UNAVAILABLE
FIELD_MANAGER: Final = "cronlock-freeze"
# The longest freeze: a maintenance window, not a way to switch a lock off for good
# (remove the CronJobs' annotation for that).
LONGEST: Final = timedelta(days=31)
REASON_CHARACTERS: Final = 256


class FreezeError(Exception):
    """What the user asked cannot be done; `code` is the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_parsers(commands: Any, connection_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    """The `freeze` and `unfreeze` subcommands of `cronlock` (`commands`: the subparsers;
    `connection_flags` adds kubectl's flags for reaching the API server, as on `status`)."""
    freeze = commands.add_parser(
        "freeze",
        help="make every run on a lock skip until a time (maintenance)",
        description=(
            "Freeze LOCK (the cronlock.io/lock of guarded CronJobs; by default a CronJob's "
            "own name) in a namespace: every run that starts on it until the freeze ends "
            "skips before its work, with a line saying until when, by whom and why. Runs "
            "already working go on. The freeze ends by itself. Needs the verb 'freeze' on the "
            "Lease (the chart's ClusterRole <release>-freezer). A lock in Redis or PostgreSQL "
            "is frozen in its store: name its Secret with --store-secret. Exit 0 when frozen, "
            "1 when the lock has no Lease, 2 on usage errors (a store's lock without "
            "--store-secret among them), 69 when the API server refuses or is unreachable."
        ),
    )
    _common(freeze)
    connection_flags(freeze)
    until = freeze.add_mutually_exclusive_group(required=True)
    until.add_argument("--for", dest="duration", help="how long, a Go duration: 2h, 90m")
    until.add_argument("--until", help="until this RFC 3339 time: 2026-12-24T18:00:00Z")
    freeze.add_argument("--reason", required=True, help="why, for everyone who sees a run skip")
    freeze.add_argument(
        "--stop-running",
        action="store_true",
        help="stop the run working on the lock too (at its next renewal, as a lost run is "
        "stopped), not only the runs that start",
    )
    thaw = commands.add_parser(
        "unfreeze",
        help="end a lock's freeze now",
        description="End the freeze of LOCK now (exit codes as for freeze).",
    )
    _common(thaw)
    connection_flags(thaw)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lock", metavar="LOCK", help="the lock (cronlock.io/lock)")
    parser.add_argument(
        "--store-secret",
        metavar="SECRET",
        help="the lock is in Redis or PostgreSQL (cronlock.io/store): the Secret its "
        "CronJobs name in cronlock.io/store-secret; needs get on that Secret",
    )
    parser.add_argument("-n", "--namespace", help="its namespace (default: the context's)")


@dataclass(frozen=True)
class Freeze:
    until: datetime
    by: str
    reason: str
    stop_running: bool = False

    def annotations(self) -> dict[str, str | None]:
        return {
            contract.ANNOTATION_FROZEN_UNTIL: format_microtime(self.until),
            contract.ANNOTATION_FROZEN_BY: self.by,
            contract.ANNOTATION_FROZEN_REASON: self.reason,
            contract.ANNOTATION_FROZEN_STOP: "true" if self.stop_running else None,
        }


def until_from(duration: str | None, until: str | None, now: datetime) -> datetime:
    """The freeze's end from `--for` or `--until`; FreezeError (usage) when it is not one
    in the future within LONGEST."""
    try:
        end = (
            now + timedelta(seconds=parse_duration(duration))
            if duration is not None
            else parse_microtime(until or "")
        )
    except (DurationError, MicroTimeError) as error:
        raise FreezeError(f"{error}", EXIT_USAGE) from None
    if end <= now:
        raise FreezeError(
            f"the freeze would end at {format_microtime(end)}, already past", EXIT_USAGE
        )
    if end - now > LONGEST:
        raise FreezeError(
            f"a freeze lasts at most {LONGEST.days} days; to stop guarding for good, remove "
            "the CronJobs' cronlock.io/enabled annotation",
            EXIT_USAGE,
        )
    return end


def clean_reason(text: str) -> str:
    reason = " ".join(text.split())
    if not reason:
        raise FreezeError("--reason: say why (everyone whose run skips reads it)", EXIT_USAGE)
    if len(reason) > REASON_CHARACTERS:
        raise FreezeError(f"--reason: at most {REASON_CHARACTERS} characters", EXIT_USAGE)
    return reason


def caller(api: kubernetes.client.ApiClient) -> str:
    """The API server's name for whoever is calling (a SelfSubjectReview)."""
    try:
        with answered("create selfsubjectreview"):
            review = kubernetes.client.AuthenticationV1Api(api).create_self_subject_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            )
    except errors.APIError as error:
        raise FreezeError(
            f"the API server cannot say who you are: {error}", EXIT_UNAVAILABLE
        ) from None
    return str(review.status.user_info.username)


def freeze(
    api: kubernetes.client.ApiClient,
    namespace: str,
    lock: str,
    *,
    duration: str | None,
    until: str | None,
    reason: str,
    stop_running: bool = False,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    store_secret: str | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> Freeze:
    """Freeze the lock: on its Lease, or with `store_secret` in the store that Secret names
    (`say` gets which host:port that is before connecting)."""
    end, why = until_from(duration, until, now()), clean_reason(reason)
    wanted = Freeze(end, caller(api), why, stop_running)
    if store_secret is None:
        _refuse_a_registry(_read(api, namespace, lock), namespace, lock, "freeze")
        _patch(api, namespace, lock, wanted.annotations())
    else:
        _stored_notes(api, namespace, lock, store_secret, wanted.annotations(), say)
    return wanted


def unfreeze(
    api: kubernetes.client.ApiClient,
    namespace: str,
    lock: str,
    store_secret: str | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> bool:
    """End the freeze; False when the lock was not frozen (nothing written)."""
    if store_secret is not None:
        return _stored_notes(
            api, namespace, lock, store_secret, dict.fromkeys(contract.FREEZE_NOTES), say
        )
    lease = _read(api, namespace, lock)
    _refuse_a_registry(lease, namespace, lock, "unfreeze")
    if read_lease(lease).frozen_until is None:
        return False
    _patch(api, namespace, lock, dict.fromkeys(contract.FREEZE_NOTES))
    return True


def registry_refusal(lease: Mapping[str, Any], namespace: str, lock: str, verb: str) -> str | None:
    """Why `verb` (freeze, unfreeze) may not act on this Lease, or None. A lock in Redis or
    PostgreSQL: its Lease only registers its users (the operator marks it so), and its runs
    read a freeze from the store, so one on the Lease would change nothing but what status
    shows."""
    notes = (lease.get("metadata") or {}).get("annotations") or {}
    store = notes.get(contract.ANNOTATION_STORE)
    if store in (None, "lease"):
        return None
    secret = notes.get(contract.ANNOTATION_STORE_SECRET) or "SECRET"
    return (
        f"lock {lock} in {namespace} is kept in {store}, and its runs read a freeze only "
        f"there, not on its Lease: {verb} it with --store-secret {secret} (the Secret its "
        "CronJobs name in cronlock.io/store-secret)"
    )


def _refuse_a_registry(lease: Mapping[str, Any], namespace: str, lock: str, verb: str) -> None:
    refusal = registry_refusal(lease, namespace, lock, verb)
    if refusal is not None:
        raise FreezeError(refusal, EXIT_USAGE)


# Compare-and-set attempts on a stored lock whose holder renews meanwhile.
STORE_ATTEMPTS: Final = 5


def _stored_notes(
    api: kubernetes.client.ApiClient,
    namespace: str,
    lock: str,
    secret: str,
    notes: dict[str, str | None],
    say: Callable[[str], None],
) -> bool:
    """Write `notes` (None: remove) on the lock's document in its store, by compare-and-set
    on the version read; a lock never taken there gets a document with only the notes.
    False when removing notes that were not there (nothing written)."""
    try:
        url = store_url(api, namespace, secret)
        store = open_store(url, read_only=False)
    except StoreAccessError as error:
        raise FreezeError(f"cannot reach the lock's store: {error}", EXIT_UNAVAILABLE) from None
    say(f"writing to {url.kind} at {address(url)} (Secret {namespace}/{secret})")
    ref = LeaseRef(namespace, contract.lease_name(lock))
    adding = any(value is not None for value in notes.values())
    try:
        for _ in range(STORE_ATTEMPTS):
            try:
                body: dict[str, Any] | None = dict(store.get(ref))
            except NotFound:
                body = None
            current = dict(((body or {}).get("metadata") or {}).get("annotations") or {})
            wanted = {k: v for k, v in {**current, **notes}.items() if v is not None}
            if wanted == current:
                return adding
            try:
                if body is None:
                    store.create(ref, _new_document(ref, wanted))
                else:
                    body["metadata"] = {**(body.get("metadata") or {}), "annotations": wanted}
                    store.replace(ref, body)
            except Conflict:
                continue  # its holder renewed meanwhile: read again
            return True
    except ApiError as error:
        raise FreezeError(f"the lock's store refused: {error}", EXIT_UNAVAILABLE) from None
    finally:
        store.close()
    raise FreezeError(
        f"lock {lock} changed {STORE_ATTEMPTS} times while it was written; try again",
        EXIT_UNAVAILABLE,
    )


def _new_document(ref: LeaseRef, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "annotations": annotations},
        "spec": {},
    }


def _read(api: kubernetes.client.ApiClient, namespace: str, lock: str) -> dict[str, Any]:
    name = contract.lease_name(lock)
    try:
        with answered(f"get lease {namespace}/{name}"):
            raw = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease(
                name, namespace, _preload_content=False
            )
    except errors.APIError as error:
        raise _refused(error, namespace, lock) from None
    body: dict[str, Any] = json.loads(raw.data)
    return body


def _patch(
    api: kubernetes.client.ApiClient, namespace: str, lock: str, notes: dict[str, str | None]
) -> None:
    name = contract.lease_name(lock)
    try:
        with answered(f"patch lease {namespace}/{name}"):
            kubernetes.client.CoordinationV1Api(api).patch_namespaced_lease(
                name,
                namespace,
                {"metadata": {"annotations": notes}},
                field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
                _preload_content=False,
            ).release_conn()
    except errors.APIError as error:
        raise _refused(error, namespace, lock) from None


def _refused(error: errors.APIError, namespace: str, lock: str) -> FreezeError:
    name = contract.lease_name(lock)
    if isinstance(error, errors.NotFound):
        return FreezeError(
            f"lock {lock} has no Lease {namespace}/{name}: the operator makes it for a "
            f"guarded CronJob whose lock is {lock} (cronlock.io/lock, else the CronJob's name)",
            EXIT_NOT_FOUND,
        )
    if isinstance(error, errors.Forbidden):
        detail = error.message or error.reason
        return FreezeError(
            f"the API server refused: {detail} (freezing needs the verbs get, patch and "
            f"freeze on leases in {namespace}: the chart's ClusterRole <release>-freezer)",
            EXIT_UNAVAILABLE,
        )
    if isinstance(error, errors.Unreachable):
        return FreezeError(f"the API server did not answer: {error.reason}", EXIT_UNAVAILABLE)
    return FreezeError(
        f"the API server answered {error.status}: {error.message or error.reason}",
        EXIT_UNAVAILABLE,
    )


def run(
    args: argparse.Namespace, api: kubernetes.client.ApiClient, namespace: str, prog: str
) -> int:
    """`cronlock freeze|unfreeze`, the client connected; what happened on stdout, one line
    (and on stderr, for a lock in a store, which host it is written at)."""

    def say(line: str) -> None:
        # The host is the Secret's, whoever wrote it: escaped as status escapes it.
        print(f"{prog}: {line.encode('unicode_escape').decode('ascii')}", file=sys.stderr)

    try:
        if args.command == "freeze":
            done = freeze(
                api,
                namespace,
                args.lock,
                duration=args.duration,
                until=args.until,
                reason=args.reason,
                stop_running=args.stop_running,
                store_secret=args.store_secret,
                say=say,
            )
            print(
                f"lock {args.lock} in {namespace} frozen until {format_microtime(done.until)} "
                f"by {done.by}: {done.reason}"
                + ("; the run working on it stops at its next renewal" if done.stop_running else "")
            )
        elif unfreeze(api, namespace, args.lock, args.store_secret, say):
            print(f"lock {args.lock} in {namespace} unfrozen")
        else:
            print(f"lock {args.lock} in {namespace} was not frozen")
    except FreezeError as error:
        prefix = f"{prog}: error:" if error.code == EXIT_USAGE else f"{prog}:"
        print(f"{prefix} {error}", file=sys.stderr)
        return error.code
    return EXIT_OK
