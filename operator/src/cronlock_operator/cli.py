"""`cronlock-operator`: a thin wrapper over `kopf run` with cronlock's handlers and settings."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import os
import sys
from collections.abc import Coroutine, Sequence

import kopf
import uvloop

from cronlock_operator.cronjob.defaults import LockDefaults
from cronlock_operator.kube.client import api_client
from cronlock_operator.kube.errors import APIError, NotFound
from cronlock_operator.kube.leaderlease import LeaderLeases
from cronlock_operator.kube.writes import Kube
from cronlock_operator.runtime import leader, liveness
from cronlock_operator.settings import (
    SIDECAR_UID,
    ContainerResources,
    OperatorSettings,
    images_from,
)
from cronlock_sidecar import contract, logformat
from cronlock_sidecar.lock.durations import DurationError, parse_duration

DEFAULT_SIDECAR_IMAGE = "ghcr.io/cronlock/cronlock-sidecar:0.1.0"

PROGRAM = "cronlock-operator"


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(contract.ENV_PREFIX + name, default)


def _env_names(name: str) -> list[str]:
    """A comma-separated list of names from CRONLOCK_<name>, blanks dropped."""
    return [part.strip() for part in (_env(name) or "").split(",") if part.strip()]


def _object_ref(flag: str, text: str) -> tuple[str, str]:
    """NAMESPACE/NAME given to `flag`; ValueError names the flag."""
    namespace, _, name = str(text).partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"{flag}: {text!r} is not NAMESPACE/NAME")
    return namespace, name


def _lease_ref(text: str) -> tuple[str, str]:
    """NAMESPACE/NAME of the leader election Lease."""
    return _object_ref("--leader-election-lease", text)


def _check_args(args: argparse.Namespace) -> tuple[str, str, float]:
    """--check-metrics and --check-wait as (namespace, service, seconds); ValueError."""
    namespace, service = _object_ref("--check-metrics", args.check_metrics)
    try:
        wait = parse_duration(args.check_wait)
    except DurationError as error:
        raise ValueError(f"--check-wait: {error}") from error
    return namespace, service, wait


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Guard CronJobs annotated cronlock.io/enabled=true, and those of namespaces "
        "labelled so, with a Lease.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {contract.VERSION}")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        action="append",
        default=None,
        help="watch this namespace (repeatable; env CRONLOCK_NAMESPACES, comma-separated)",
    )
    scope.add_argument(
        "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    parser.add_argument(
        "--namespace-opt-in",
        action=argparse.BooleanOptionalAction,
        default=_env("NAMESPACE_OPT_IN", "true") != "false",
        help="guard every CronJob of a namespace labelled cronlock.io/enabled=true unless it "
        "is annotated cronlock.io/enabled=false; watches namespaces by that label (needs get, "
        "list and watch on namespaces; default on; env CRONLOCK_NAMESPACE_OPT_IN)",
    )
    parser.add_argument("--sidecar-image", default=_env("SIDECAR_IMAGE", DEFAULT_SIDECAR_IMAGE))
    parser.add_argument(
        "--sidecar-image-pull-policy", default=_env("SIDECAR_IMAGE_PULL_POLICY", "IfNotPresent")
    )
    parser.add_argument(
        "--sidecar-images-from",
        default=_env("SIDECAR_IMAGES_FROM", ""),
        metavar="NAMESPACE/DEPLOYMENT",
        help="read the sidecar and stores images from this Deployment's init containers "
        "sidecar-image and sidecar-stores-image at start, instead of --sidecar-image and "
        "--sidecar-stores-image (the chart's: its own Deployment, which Kustomize's images: "
        "rewrites; needs get on it; env CRONLOCK_SIDECAR_IMAGES_FROM)",
    )
    parser.add_argument(
        "--sidecar-stores-image",
        default=_env("SIDECAR_STORES_IMAGE", ""),
        help="the sidecar image with the Redis and PostgreSQL clients, for CronJobs whose "
        "lock is in such a store (cronlock.io/store); '' (default) refuses those CronJobs "
        "(env CRONLOCK_SIDECAR_STORES_IMAGE)",
    )
    for flag, env, default, what in (
        ("--sidecar-run-as-user", "SIDECAR_RUN_AS_USER", str(SIDECAR_UID), "UID"),
        ("--sidecar-run-as-group", "SIDECAR_RUN_AS_GROUP", str(SIDECAR_UID), "GID"),
    ):
        parser.add_argument(
            flag,
            default=_env(env, default),
            help=f"the injected containers' {what} (default {default}; '' leaves it unset, for the "
            f"platform to assign, e.g. OpenShift's restricted-v2; env CRONLOCK_{env})",
        )
    sidecar_resources = ContainerResources()
    for resource, kind in (
        ("cpu", "request"),
        ("memory", "request"),
        ("cpu", "limit"),
        ("memory", "limit"),
    ):
        env = f"SIDECAR_{resource.upper()}_{kind.upper()}"
        default = getattr(sidecar_resources, f"{resource}_{kind}") or ""
        parser.add_argument(
            f"--sidecar-{resource}-{kind}",
            default=_env(env, default),
            help=f"the injected containers' {resource} {kind} (a quantity; default "
            f"{default or 'none'}; '' for none; env CRONLOCK_{env})",
        )
    # The lock defaults' flags default to `LockDefaults`, where each is spelled once.
    lock = LockDefaults()
    parser.add_argument(
        "--default-ttl", default=_env("DEFAULT_TTL", f"{lock.default_ttl_seconds}s")
    )
    parser.add_argument("--default-renew", default=_env("DEFAULT_RENEW"))
    parser.add_argument(
        "--default-policy",
        default=_env("DEFAULT_POLICY", lock.default_policy),
        choices=list(contract.DEFAULT_POLICIES),
    )
    parser.add_argument(
        "--alert-after-missed",
        default=_env("ALERT_AFTER_MISSED", str(lock.default_alert_after_missed)),
        help="ticks without a successful run before a guarded CronJob gets a NotSucceeding "
        "Warning (0: never; cronlock.io/alert-after-missed overrides it; default "
        f"{lock.default_alert_after_missed})",
    )
    parser.add_argument(
        "--missed-tolerance",
        default=_env("MISSED_TOLERANCE", f"{lock.missed_tolerance_seconds}s"),
        help="how long after its tick a run may start before the tick counts as missed, for "
        f"a CronJob without startingDeadlineSeconds (default {lock.missed_tolerance_seconds}s)",
    )
    parser.add_argument(
        "--cluster-name",
        default=_env("CLUSTER_NAME", ""),
        help="this cluster's name, written by each run into its lock's tick record so that "
        "`cronlock status` says which cluster worked a tick ('' for none; env "
        "CRONLOCK_CLUSTER_NAME; chart value clusterName)",
    )
    parser.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", "8080") or 0))
    parser.add_argument(
        "--metrics-bind-address",
        default=_env("METRICS_BIND_ADDRESS", "0.0.0.0"),
        help="address /metrics listens on (default all interfaces, for the metrics Service)",
    )
    parser.add_argument(
        "--leader-election",
        action="store_true",
        default=_env("LEADER_ELECTION") == "true",
        help="lead through a Lease before writing anything, so that several replicas may run",
    )
    parser.add_argument(
        "--leader-election-lease",
        default=_env("LEADER_ELECTION_LEASE", "cronlock-system/cronlock-operator-leader"),
        help="NAMESPACE/NAME of that Lease",
    )
    parser.add_argument(
        "--uninstall",
        action="store_true",
        help="revert every injected CronJob in the watched namespaces, delete the Leases, "
        "holder Roles and RoleBindings cronlock made, and exit (the chart's uninstall hook)",
    )
    parser.add_argument(
        "--keep-namespace",
        action="append",
        default=None,
        help="with --uninstall, leave this namespace alone (repeatable; env "
        "CRONLOCK_KEEP_NAMESPACES, comma-separated): the chart's hook for an upgrade that "
        "narrowed a watch of every namespace",
    )
    parser.add_argument(
        "--revert-only",
        action="store_true",
        help="with --uninstall, only revert the CronJobs: leave the Leases and holder Roles "
        "to the runs still in progress (the chart's hook for an upgrade that narrowed the watch)",
    )
    parser.add_argument(
        "--check-metrics",
        metavar="NAMESPACE/SERVICE",
        help="scrape each ready endpoint of the operator's metrics Service, exit 0 when one "
        "serves cronlock's metrics, 69 when none does within --check-wait (the chart's helm test)",
    )
    parser.add_argument(
        "--check-wait",
        default="60s",
        help="with --check-metrics, how long to retry (Go duration, default 60s)",
    )
    parser.add_argument(
        "--liveness",
        default=_env("LIVENESS", "http://0.0.0.0:8081/healthz"),
        help="URL of the liveness endpoint (/healthz, probed by the kubelet), served by the "
        "operator's bounded HTTP server ('' to disable)",
    )
    parser.add_argument(
        "--log-format", default=_env("LOG_FORMAT", "plain"), choices=["plain", "json"]
    )
    parser.add_argument("--verbose", action="store_true", default=_env("VERBOSE") == "true")
    args = parser.parse_args(argv)
    if args.namespace is None and not args.all_namespaces:
        args.namespace = _env_names("NAMESPACES") or None
    return args


def settings_from(args: argparse.Namespace) -> OperatorSettings:
    try:
        ttl = parse_duration(args.default_ttl)
        renew = parse_duration(args.default_renew) if args.default_renew else None
    except DurationError as error:
        raise ValueError(f"--default-ttl/--default-renew: {error}") from error
    if ttl != int(ttl):
        raise ValueError(f"--default-ttl: {args.default_ttl!r} must be whole seconds")
    try:
        tolerance = parse_duration(args.missed_tolerance)
    except DurationError as error:
        raise ValueError(f"--missed-tolerance: {error}") from error
    if not str(args.alert_after_missed).isdigit() or len(str(args.alert_after_missed)) > 4:
        raise ValueError(
            f"--alert-after-missed: {args.alert_after_missed!r} is not a number of ticks "
            "(0 for never)"
        )
    _lease_ref(args.leader_election_lease)
    try:
        ipaddress.ip_address(args.metrics_bind_address)
    except ValueError:
        raise ValueError(
            f"--metrics-bind-address: {args.metrics_bind_address!r} is not an IP address "
            "(0.0.0.0 for all interfaces, 127.0.0.1 for loopback only)"
        ) from None
    return OperatorSettings(
        sidecar_image=args.sidecar_image,
        sidecar_image_pull_policy=args.sidecar_image_pull_policy,
        sidecar_stores_image=args.sidecar_stores_image or None,
        lock=LockDefaults(
            default_ttl_seconds=int(ttl),
            default_renew_seconds=renew,
            default_policy=args.default_policy,
            default_alert_after_missed=int(args.alert_after_missed),
            missed_tolerance_seconds=max(1, round(tolerance)),
        ),
        sidecar_run_as_user=_id("--sidecar-run-as-user", args.sidecar_run_as_user),
        sidecar_run_as_group=_id("--sidecar-run-as-group", args.sidecar_run_as_group),
        sidecar_resources=ContainerResources(
            cpu_request=args.sidecar_cpu_request or None,
            memory_request=args.sidecar_memory_request or None,
            cpu_limit=args.sidecar_cpu_limit or None,
            memory_limit=args.sidecar_memory_limit or None,
        ),
        cluster_name=args.cluster_name,
    )


def _id(flag: str, text: str) -> int | None:
    """A UID or GID given to `flag`; '' is None (unset). ValueError names the flag."""
    if not text.strip():
        return None
    if len(text.strip()) > 10 or not (text.strip().isascii() and text.strip().isdigit()):
        raise ValueError(f"{flag}: {text!r} is not a numeric id; expected for example 65532, or ''")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = settings_from(args)
        check = _check_args(args) if args.check_metrics else None
        if args.liveness:
            liveness.endpoint(args.liveness)
    except ValueError as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return contract.EXIT_CONFIG
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    # kopf's handlers, our format: the sidecar's JSON schema, or its plain lines with the
    # time and level (kopf's plain format has neither).
    formatter = (
        logformat.JsonFormatter()
        if args.log_format == "json"
        else logformat.PlainFormatter(PROGRAM)
    )
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    # kopf reports every handled watch event at INFO; our own lines say what happened.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if check is not None:
        from cronlock_operator.selfcheck import check_service

        return check_service(*check)
    if args.uninstall:
        from cronlock_operator.uninstall import uninstall

        keep = args.keep_namespace or _env_names("KEEP_NAMESPACES")
        return uninstall(
            Kube(api_client()), args.namespace or [], keep=keep, revert_only=args.revert_only
        )
    if args.sidecar_images_from:
        try:
            settings = _images_from_deployment(settings, args.sidecar_images_from)
        except ValueError as error:
            logging.getLogger(__name__).error("%s", error)
            return contract.EXIT_CONFIG
        except APIError as error:
            logging.getLogger(__name__).error(
                "cannot read the sidecar images: %s (the chart grants get on the operator's "
                "own Deployment)",
                error,
            )
            return contract.EXIT_UNAVAILABLE
    from cronlock_operator.runtime import handlers  # registers the handlers with kopf

    if args.namespace_opt_in:
        handlers.watch_namespaces()
    from cronlock_operator.runtime import metrics

    # Every replica serves /metrics from the start, a waiting one with cronlock_leader 0:
    # a replica Prometheus cannot scrape is a down target (kube-prometheus' TargetDown).
    if args.metrics_port:
        try:
            metrics.serve(args.metrics_port, args.metrics_bind_address)
        except OSError as error:
            logging.getLogger(__name__).error(
                "cannot serve /metrics on %s:%d: %s (--metrics-port 0 turns it off)",
                args.metrics_bind_address,
                args.metrics_port,
                error.strerror or error,
            )
            return contract.EXIT_CONFIG
    # The liveness probe is ours, not kopf's, from the start: bounded like /metrics
    # (runtime.liveness says what it reports).
    if args.liveness:
        try:
            liveness.serve(args.liveness)
        except OSError as error:
            logging.getLogger(__name__).error(
                "cannot serve the liveness probe at %s: %s (--liveness '' turns it off)",
                args.liveness,
                error.strerror or error,
            )
            return contract.EXIT_CONFIG
    elector = _lead(args) if args.leader_election else None
    metrics.leader.set(1)
    _run_loop(
        kopf.operator(
            standalone=True,
            # kopf would derive it from getpass.getuser(), which fails for a UID without a
            # passwd entry: the image's 65532, or the one OpenShift assigns.
            identity=leader.identity(),  # type: ignore[arg-type]  # kopf's NewType, not exported
            namespaces=args.namespace or (),
            clusterwide=not args.namespace,
            liveness_endpoint=None,  # served by runtime.liveness, bounded
            memo=kopf.Memo(
                settings=settings,
                namespaces=args.namespace or [],
                namespace_opt_in=args.namespace_opt_in,
            ),
        )
    )
    if elector is not None:
        elector.release()
    return 0


def _images_from_deployment(settings: OperatorSettings, ref: str) -> OperatorSettings:
    """`settings` with the images that Deployment NAMESPACE/NAME's init containers name
    (settings.images_from); ValueError for a bad reference or Deployment, an APIError when
    it cannot be read."""
    namespace, name = _object_ref("--sidecar-images-from", ref)
    try:
        deployment = Kube(api_client()).read_deployment(namespace, name)
    except NotFound as error:
        raise ValueError(f"--sidecar-images-from: {error}") from error
    sidecar, stores = images_from(deployment)
    logging.getLogger(__name__).info(
        "sidecar images from deployment %s: %s%s",
        ref,
        sidecar,
        f", stores {stores}" if stores else "",
    )
    return dataclasses.replace(settings, sidecar_image=sidecar, sidecar_stores_image=stores)


def _run_loop(operator: Coroutine[None, None, None]) -> None:
    """Run kopf's operator on uvloop's event loop, as `kopf run` would where uvloop is
    installed: at 10,000 CronJobs the operator spent a quarter less CPU on it than on
    asyncio's own loop (docs/PERFORMANCE.md)."""
    # CancelledError: a stop, which kopf.run swallows too.
    with (
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
        contextlib.suppress(asyncio.CancelledError),
    ):
        runner.run(operator)


def _lead(args: argparse.Namespace) -> leader.Elector:
    """Wait for the lead (answering the liveness probe meanwhile), then keep it; a replica
    that loses it exits at once, before another may take over (cronlock_operator.runtime.leader)."""
    namespace, name = _lease_ref(args.leader_election_lease)
    elector = leader.Elector(LeaderLeases(api_client()), namespace, name, leader.identity())
    liveness.state.waiting(True)
    elector.acquire()
    liveness.state.waiting(False)

    def lost() -> None:
        logging.getLogger(__name__).error("exiting: another replica may lead from now on")
        logging.shutdown()
        os._exit(contract.EXIT_SOFTWARE_LOST)

    elector.keep(lost)
    return elector
