"""Flags and their CRONLOCK_* twins, all validated before the API server is touched."""

from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, NoReturn

from cronlock_sidecar import contract
from cronlock_sidecar.lock import ticks
from cronlock_sidecar.lock.durations import (
    DURATION_FORMS,
    DurationError,
    format_duration,
    parse_duration,
)
from cronlock_sidecar.lock.maxhold import max_hold_problem
from cronlock_sidecar.lock.model import Timing, TimingError, replace_wait_timeout
from cronlock_sidecar.lock.permits import read_count
from cronlock_sidecar.stores.url import StoreUrl, StoreUrlError, parse_store_url
from cronlock_sidecar.transport.seam import LeaseRef

COMMANDS = ("hold", "gate", "run")
POLICIES = contract.POLICIES
STOP_MODES = ("auto", "liveness", "signal")
LOG_FORMATS = contract.LOG_FORMATS
LOG_LEVELS = contract.LOG_LEVELS
DEFAULT_WAIT_TIMEOUT = 0.0

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_IDENTITY = re.compile(r"[!-~]{1,253}$")

# flag name -> environment twin
ENV_TWINS: Mapping[str, str] = {
    "lease": contract.ENV_LEASE,
    "ttl": contract.ENV_TTL,
    "renew": contract.ENV_RENEW,
    "policy": contract.ENV_POLICY,
    "wait_timeout": contract.ENV_WAIT_TIMEOUT,
    "jitter": contract.ENV_JITTER,
    "identity": contract.ENV_IDENTITY,
    "skew": contract.ENV_SKEW,
    "stop": contract.ENV_STOP,
    "kill_grace": contract.ENV_KILL_GRACE,
    "max_hold": contract.ENV_MAX_HOLD,
    "port": contract.ENV_PORT,
    "run_dir": contract.ENV_RUN_DIR,
    "pod_name": contract.ENV_POD_NAME,
    "pod_uid": contract.ENV_POD_UID,
    "pod_namespace": contract.ENV_POD_NAMESPACE,
    "job_name": contract.ENV_JOB_NAME,
    "log_format": contract.ENV_LOG_FORMAT,
    "log_level": contract.ENV_LOG_LEVEL,
    "store": contract.ENV_STORE,
    "store_file": contract.ENV_STORE_FILE,
    "store_kind": contract.ENV_STORE_KIND,
    "schedule": contract.ENV_SCHEDULE,
    "time_zone": contract.ENV_TIME_ZONE,
    "tick_window": contract.ENV_TICK_WINDOW,
    "tick": contract.ENV_TICK_AT,
    "tick_of": contract.ENV_TICK_OF,
    "run_id": contract.ENV_RUN_ID,
    "permits": contract.ENV_PERMITS,
    "cronjob": contract.ENV_CRONJOB,
    "job_uid": contract.ENV_JOB_UID,
    "cluster": contract.ENV_CLUSTER,
    "termination_log": contract.ENV_TERMINATION_LOG,
}
# `run`'s own tick options: meaningful only with --schedule or --tick.
TICK_OPTIONS = ("time_zone", "tick_window", "tick_of", "run_id")
LONGEST_TICK_WINDOW_SECONDS = 24 * 3600.0
# A URL file holds one line; anything this long is not one.
STORE_FILE_LIMIT = 64 * 1024


class ConfigError(Exception):
    """An option that can never work; the message names it and the accepted forms (exit 78)."""


class Options(NamedTuple):
    """Everything a subcommand needs, already validated."""

    command: str
    lease: LeaseRef | None
    ttl: float
    renew: float
    skew: float
    policy: str
    wait_timeout: float
    identity: str
    stop: str
    kill_grace: float
    port: int
    run_dir: str
    pod_name: str
    pod_uid: str
    pod_namespace: str
    job_name: str
    log_format: str
    log_level: str
    cmd: tuple[str, ...]
    # None: the Lease, through the API server. Its repr and str never show the password.
    store: StoreUrl | None = None
    # `run` outside Kubernetes: the tick from a cron schedule (in a time zone, started at
    # most tick_window after it) or named (tick_at), whose ticks, and the run's id.
    schedule: str = ""
    time_zone: str = ""
    tick_window: float = float(contract.DEFAULT_TICK_WINDOW_SECONDS)
    tick_at: datetime | None = None
    tick_of: str = ""
    run_id: str = ""
    # hold: the CronJob whose ticks the pod's Job works, the Job's uid, the cluster's name.
    cronjob: str = ""
    job_uid: str = ""
    cluster: str = ""
    # gate: where it writes the skip line of a run whose tick already ran; hold: where it
    # writes the line of a run it stopped at max_hold.
    termination_log: str = contract.TERMINATION_LOG
    # run, hold: the lock's N it requires (--permits, CRONLOCK_PERMITS); None: the
    # lock's document says.
    permits: int | None = None
    # hold, run: the longest the run may hold the lock from its acquire; 0: no bound.
    max_hold: float = 0.0
    # hold and run: the longest delay before the lock is taken (lock/jitter.py); 0: none.
    jitter: float = 0.0

    @property
    def timing(self) -> Timing:
        return Timing.of(self.ttl, self.renew, self.skew)

    @property
    def observe(self) -> bool:
        """Under `policy: observe` a run goes on whatever the Lease says: never stopped."""
        return self.policy == "observe"

    @property
    def gate_timeout(self) -> float:
        """The gate gives up a minute after the longest the sidecar may wait to decide: its
        jitter, then its wait for the lock."""
        return self.jitter + self.wait_timeout + contract.GATE_TIMEOUT_AFTER_WAIT_SECONDS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see cronlock-sidecar {self.prog.split()[-1]} --help)")


def _parser() -> _Parser:
    parser = _Parser(
        prog="cronlock-sidecar",
        description="Hold a coordination.k8s.io/v1 Lease so CronJob runs never overlap.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    hold = commands.add_parser("hold", help="native sidecar: decide, serve /held, renew, release")
    gate = commands.add_parser("gate", help="init container: wait for the sidecar's decision")
    run = commands.add_parser(
        "run",
        help="acquire, run CMD, renew, release: the whole pattern in one process",
        usage="cronlock-sidecar run --lease NS/NAME [options] -- CMD [ARGS...]",
    )
    for sub in (hold, run):
        sub.add_argument("--lease", metavar="NS/NAME", help="the Lease (CRONLOCK_LEASE)")
        sub.add_argument("--ttl", metavar="D", help="lease duration, default 60s (CRONLOCK_TTL)")
        sub.add_argument(
            "--renew", metavar="D", help="renew period, default ttl/3 (CRONLOCK_RENEW)"
        )
        sub.add_argument(
            "--policy", metavar="skip|wait|replace|observe", help="when held (CRONLOCK_POLICY)"
        )
        sub.add_argument("--identity", metavar="ID", help="holder identity (CRONLOCK_IDENTITY)")
        sub.add_argument("--skew", metavar="D", help="clock skew allowance, default 2s")
        sub.add_argument("--kill-grace", metavar="D", help="SIGTERM to SIGKILL, default 5s")
        sub.add_argument(
            "--max-hold",
            metavar="D",
            help="stop the run once it has held the lock this long, counted from the acquire; "
            "default 0 (no bound) (CRONLOCK_MAX_HOLD)",
        )
        sub.add_argument("--job-name", metavar="NAME", help="this pod's Job (CRONLOCK_JOB_NAME)")
        sub.add_argument(
            "--store",
            metavar="URL",
            help="lock in Redis or PostgreSQL instead of the Lease: redis[s]://… or "
            "postgresql://… (CRONLOCK_STORE; the command line shows it to `ps`, prefer the env "
            "or --store-file)",
        )
        sub.add_argument(
            "--store-file",
            metavar="PATH",
            help="read the store URL from PATH (CRONLOCK_STORE_FILE)",
        )
        sub.add_argument(
            "--store-kind",
            metavar="redis|postgres",
            help="the store the URL must name (CRONLOCK_STORE_KIND; set by the operator)",
        )
    for sub in (hold, gate, run):
        sub.add_argument(
            "--wait-timeout",
            metavar="D",
            help="with --policy wait (default 0s) or replace (default ttl + skew)",
        )
        sub.add_argument(
            "--jitter",
            metavar="D",
            help="start the run up to D (at most 1h) later, uniformly: per tick the same "
            "instant, else at random (CRONLOCK_JITTER)",
        )
        sub.add_argument("--log-format", metavar="plain|json", help="(CRONLOCK_LOG_FORMAT)")
        sub.add_argument("--log-level", metavar="LEVEL", help="debug|info|warning|error")
    for sub in (hold, gate):
        sub.add_argument("--run-dir", metavar="DIR", help=f"default {contract.RUN_DIR}")
        sub.add_argument(
            "--termination-log",
            metavar="PATH",
            help=f"where a skip's or max-hold stop's line goes ({contract.TERMINATION_LOG})",
        )
    run.add_argument(
        "--schedule",
        metavar="CRON",
        help="take the tick from this cron schedule, as the CronJob controller reads it: the "
        "latest schedule time at or before now (CRONLOCK_SCHEDULE)",
    )
    run.add_argument(
        "--time-zone",
        metavar="TZ",
        help="the schedule's IANA time zone, as a CronJob's spec.timeZone; default UTC "
        "(CRONLOCK_TIME_ZONE)",
    )
    run.add_argument(
        "--tick-window",
        metavar="D",
        help="refuse (exit 78) when started longer than D after the schedule's latest time, "
        f"default {contract.DEFAULT_TICK_WINDOW_SECONDS}s (CRONLOCK_TICK_WINDOW)",
    )
    run.add_argument(
        "--tick",
        metavar="RFC3339",
        help="the tick this run works, e.g. 2026-12-06T12:00:00Z; refused when ahead of now "
        "(CRONLOCK_TICK_AT)",
    )
    run.add_argument(
        "--tick-of",
        metavar="NAME",
        help="whose ticks: default the lock's name; the CronJob's name to share its ticks "
        "(CRONLOCK_TICK_OF)",
    )
    run.add_argument(
        "--run-id",
        metavar="ID",
        help="this run's id; another id's run of the same tick skips (default: the identity; "
        "CRONLOCK_RUN_ID)",
    )
    run.add_argument(
        "--permits",
        metavar="N",
        help=f"at most N runs hold the lock at once, 1-{contract.MAX_PERMITS}: written on a "
        "Lease that says none, refused (exit 78) when the Lease says another N; not yet with "
        "--store (CRONLOCK_PERMITS)",
    )
    hold.add_argument("--stop", metavar="MODE", help="auto|liveness|signal (CRONLOCK_STOP)")
    hold.add_argument("--port", metavar="N", help=f"HTTP port, default {contract.SIDECAR_PORT}")
    hold.add_argument("--pod-name", metavar="NAME", help="(CRONLOCK_POD_NAME)")
    hold.add_argument("--pod-uid", metavar="UID", help="(CRONLOCK_POD_UID)")
    hold.add_argument("--pod-namespace", metavar="NS", help="(CRONLOCK_POD_NAMESPACE)")
    hold.add_argument(
        "--cronjob",
        metavar="NAME",
        help="whose ticks this Job works (CRONLOCK_CRONJOB)",
    )
    hold.add_argument("--job-uid", metavar="UID", help="this pod's Job's uid (CRONLOCK_JOB_UID)")
    hold.add_argument(
        "--permits",
        metavar="N",
        help="the N of a lock in a store, written by the claim on a document that says none "
        "(the operator's, for a store: CRONLOCK_PERMITS)",
    )
    hold.add_argument(
        "--cluster", metavar="NAME", help="this cluster's name, for the record (CRONLOCK_CLUSTER)"
    )
    return parser


class _Values:
    """Each option from its flag, else its environment twin, remembering where it came from."""

    def __init__(self, parsed: argparse.Namespace, env: Mapping[str, str]) -> None:
        self.parsed = parsed
        self.env = env

    def get(self, key: str) -> tuple[str | None, str]:
        flag = "--" + key.replace("_", "-")
        value = getattr(self.parsed, key, None)
        if value is not None:
            return str(value), flag
        twin = ENV_TWINS[key]
        from_env = self.env.get(twin)
        if from_env is not None and from_env != "":
            return from_env, f"{flag} (from {twin})"
        return None, flag

    def duration(self, key: str, default: float) -> float:
        text, name = self.get(key)
        if text is None:
            return default
        try:
            return parse_duration(text)
        except DurationError as error:
            raise ConfigError(f"{name}: {error}") from error

    def choice(self, key: str, choices: Sequence[str], default: str) -> str:
        text, name = self.get(key)
        if text is None:
            return default
        if text not in choices:
            raise ConfigError(f"{name}: {text!r} is not one of {', '.join(choices)}")
        return text

    def text(self, key: str, default: str = "") -> str:
        text, _ = self.get(key)
        return default if text is None else text


def parse_lease(text: str, name: str) -> LeaseRef:
    namespace, slash, lease = text.partition("/")
    forms = "expected NAMESPACE/NAME, e.g. default/cronlock-report"
    if not slash or not namespace or not lease:
        raise ConfigError(f"{name}: {text!r} is not a Lease reference; {forms}")
    if len(namespace) > 63 or not _DNS_LABEL.match(namespace):
        raise ConfigError(
            f"{name}: namespace {namespace!r} is not a DNS-1123 label "
            f"(lowercase letters, digits and '-', at most 63); {forms}"
        )
    if len(lease) > 253 or not _DNS_SUBDOMAIN.match(lease):
        raise ConfigError(
            f"{name}: name {lease!r} is not a DNS-1123 subdomain "
            f"(lowercase letters, digits, '-' and '.', at most 253); {forms}"
        )
    return LeaseRef(namespace, lease)


def _split_command(argv: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    items = list(argv)
    if items[:1] == ["run"] and "--" in items:
        cut = items.index("--")
        return items[:cut], tuple(items[cut + 1 :])
    return items, ()


def parse_options(argv: Sequence[str], env: Mapping[str, str]) -> Options:
    """Validated options for one subcommand; ConfigError names the first bad option."""
    own_args, cmd = _split_command(argv)
    parsed = _parser().parse_args(own_args)
    values = _Values(parsed, env)
    command: str = parsed.command

    ttl = values.duration("ttl", float(contract.DEFAULT_TTL_SECONDS))
    renew_text, _ = values.get("renew")
    renew = None if renew_text is None else values.duration("renew", 0.0)
    skew = values.duration("skew", float(contract.DEFAULT_SKEW_SECONDS))
    timing = Timing.of(ttl, renew, skew)
    try:
        timing.check()
    except TimingError as error:
        detail = (
            f"{error.reason}; expected {DURATION_FORMS}" if error.field == "ttl" else error.reason
        )
        raise ConfigError(f"{values.get(error.field)[1]}: {detail}") from None
    policy = values.choice("policy", POLICIES, "skip")
    # replace waits for the holder to yield; by default until a frozen holder's Lease has
    # surely expired: ttl + skew after its last renewal (which can be as late as our
    # start), judged strictly, plus one renew interval for the retries and the clearing.
    default_wait = replace_wait_timeout(timing) if policy == "replace" else DEFAULT_WAIT_TIMEOUT
    wait_timeout = values.duration("wait_timeout", default_wait)
    if wait_timeout > 0 and policy not in contract.WAITING_POLICIES and command != "gate":
        raise ConfigError(
            f"{values.get('wait_timeout')[1]}: only meaningful with --policy wait, replace or "
            "queue (drop it, or set one of those)"
        )
    if policy == "queue" and command == "run":
        # A queued tick is a suspended Job the operator lets go; a process has no Job.
        raise ConfigError(
            f"{values.get('policy')[1]}: queue is a CronJob's policy (its ticks wait as "
            "suspended Jobs); a process that should wait for the lock uses --policy wait"
        )
    jitter = _jitter(values)
    kill_grace = values.duration("kill_grace", timing.default_kill_grace_ms() / 1000)
    max_hold = values.duration("max_hold", 0.0) if command != "gate" else 0.0
    problem = max_hold_problem(max_hold, timing, policy)
    if problem is not None:
        raise ConfigError(f"{values.get('max_hold')[1]}: {values.get('max_hold')[0]} {problem}")
    stop = values.choice("stop", STOP_MODES, "auto")
    log_format = values.choice("log_format", LOG_FORMATS, "plain")
    log_level = values.choice("log_level", LOG_LEVELS, "info")

    port_text, port_name = values.get("port")
    port = contract.SIDECAR_PORT
    if port_text is not None:
        if not port_text.isdigit() or int(port_text) > 65535:
            raise ConfigError(f"{port_name}: {port_text!r} is not a TCP port; expected 0-65535")
        port = int(port_text)

    run_dir = values.text("run_dir", contract.RUN_DIR)
    if not run_dir:
        raise ConfigError("--run-dir: empty; expected a directory path")

    lease: LeaseRef | None = None
    if command != "gate":
        lease_text, lease_name = values.get("lease")
        if lease_text is None:
            raise ConfigError(
                f"--lease: required; expected NAMESPACE/NAME (or set {contract.ENV_LEASE})"
            )
        lease = parse_lease(lease_text, lease_name)
    if command == "run" and not cmd:
        raise ConfigError("CMD: missing; usage: cronlock-sidecar run --lease NS/NAME -- CMD [ARGS]")

    store = _store(values) if command != "gate" else None

    pod_name = values.text("pod_name")
    pod_uid = values.text("pod_uid")
    identity_text, identity_name = values.get("identity")
    if identity_text is not None:
        if not _IDENTITY.match(identity_text):
            raise ConfigError(
                f"{identity_name}: {identity_text!r} is not an identity; expected 1-253 "
                "printable characters without spaces"
            )
        identity = identity_text
    elif command == "hold":
        if not pod_name or not pod_uid:
            raise ConfigError(
                f"--identity: not set, and {contract.ENV_POD_NAME}/{contract.ENV_POD_UID} "
                "(downward API) are missing; set both or pass --identity"
            )
        identity = contract.holder_identity(pod_name, pod_uid)
    else:
        # os.urandom(4).hex() is what secrets.token_hex(4) returns; secrets would import
        # hashlib and hmac, which a short run's start-up has no use for.
        identity = f"{socket.gethostname()}_{os.getpid()}_{os.urandom(4).hex()}"

    tick = _tick_options(values, lease, identity) if command == "run" else _TickOptions()
    cronjob, job_uid, cluster = _tick_identity(values, values.text("job_name"))
    termination_log = values.text("termination_log", contract.TERMINATION_LOG)
    if not termination_log:
        raise ConfigError("--termination-log: empty; expected a file path")
    # hold: CRONLOCK_PERMITS alone, which the injection sets for a lock in a store (whose
    # document no operator writes N on); on a Lease the document's N is the operator's.
    permits = _permits(values, policy, store) if command in ("run", "hold") else None

    return Options(
        command=command,
        lease=lease,
        ttl=timing.ttl,
        renew=timing.renew,
        skew=timing.skew,
        policy=policy,
        wait_timeout=wait_timeout,
        identity=identity,
        stop=stop,
        kill_grace=kill_grace,
        port=port,
        run_dir=run_dir,
        pod_name=pod_name,
        pod_uid=pod_uid,
        pod_namespace=values.text("pod_namespace"),
        job_name=values.text("job_name"),
        log_format=log_format,
        log_level=log_level,
        cmd=cmd,
        store=store,
        cronjob=cronjob,
        job_uid=job_uid,
        cluster=cluster,
        termination_log=termination_log,
        max_hold=max_hold,
        jitter=jitter,
        schedule=tick.schedule,
        time_zone=tick.time_zone,
        tick_window=tick.tick_window,
        tick_at=tick.tick_at,
        tick_of=tick.tick_of,
        run_id=tick.run_id,
        permits=permits,
    )


def _permits(values: _Values, policy: str, store: StoreUrl | None) -> int | None:
    """`run --permits N`: the lock's N this run requires (None when not given)."""
    text, name = values.get("permits")
    if text is None:
        return None
    count = read_count(text)
    if count is None:
        raise ConfigError(
            f"{name}: {text!r} is not a number of permits; expected a whole number "
            f"1-{contract.MAX_PERMITS}"
        )
    if count > 1 and policy == "replace":
        raise ConfigError(
            f"{name}: {count} permits with --policy replace are not supported yet (which of "
            "the holders would be replaced is not settled); use --policy skip or wait"
        )
    return count


class _TickOptions(NamedTuple):
    schedule: str = ""
    time_zone: str = ""
    tick_window: float = float(contract.DEFAULT_TICK_WINDOW_SECONDS)
    tick_at: datetime | None = None
    tick_of: str = ""
    run_id: str = ""


def _tick_options(values: _Values, lease: LeaseRef | None, identity: str) -> _TickOptions:
    """`run`'s tick options, each checked; none of them without --schedule or --tick."""
    schedule, schedule_name = values.get("schedule")
    tick_text, tick_name = values.get("tick")
    if schedule is None and tick_text is None:
        for key in TICK_OPTIONS:
            text, name = values.get(key)
            if text is not None:
                raise ConfigError(
                    f"{name}: only meaningful with --schedule or --tick (this run has no tick: "
                    "a manual run)"
                )
        return _TickOptions()
    if schedule is not None and tick_text is not None:
        raise ConfigError(f"{schedule_name} and {tick_name}: both set; name the tick one way")
    zone, zone_name = values.get("time_zone")
    window_text, window_name = values.get("tick_window")
    tick_at: datetime | None = None
    if tick_text is not None:
        for text, name in ((zone, zone_name), (window_text, window_name)):
            if text is not None:
                raise ConfigError(f"{name}: only meaningful with --schedule, not {tick_name}")
        tick_at = parse_tick_option(tick_text, tick_name)
    window = values.duration("tick_window", float(contract.DEFAULT_TICK_WINDOW_SECONDS))
    if not 1 <= window <= LONGEST_TICK_WINDOW_SECONDS:
        raise ConfigError(
            f"{window_name}: {format_duration(window)} is out of range; expected 1s to 24h"
        )
    if schedule is not None:
        # The parser only when asked for: it is off a short run's start-up path.
        from cronlock_sidecar.lock.schedule import refusal

        reason = refusal(schedule, zone)
        if reason is not None:
            about_zone = zone is not None and reason.startswith(f"unknown time zone {zone!r}")
            raise ConfigError(f"{zone_name if about_zone else schedule_name}: {reason}")
    tick_of, tick_of_name = values.get("tick_of")
    if tick_of is None:
        default = lease.name if lease is not None else ""
        if not ticks.valid_name(default):
            raise ConfigError(
                f"--tick-of: not set, and the lock's name {default!r} is no CronJob name "
                f"(lowercase letters, digits, '-' and '.', at most {ticks.LONGEST_NAME}); give "
                "--tick-of NAME (the CronJob's name, to share a CronJob's ticks)"
            )
        tick_of = default
    elif not ticks.valid_name(tick_of):
        raise ConfigError(
            f"{tick_of_name}: {tick_of!r} is not a CronJob's name; expected lowercase letters, "
            f"digits, '-' and '.', at most {ticks.LONGEST_NAME}, starting and ending "
            "alphanumeric (the CronJob's metadata.name, to share its ticks)"
        )
    run_id, run_id_name = values.get("run_id")
    if run_id is not None and not _IDENTITY.match(run_id):
        raise ConfigError(
            f"{run_id_name}: {run_id!r} is not a run id; expected 1-253 printable characters "
            "without spaces"
        )
    return _TickOptions(schedule or "", zone or "", window, tick_at, tick_of, run_id or identity)


def parse_tick_option(text: str, name: str) -> datetime:
    """An RFC 3339 time with its offset, in whole seconds, as UTC."""
    forms = "expected RFC 3339 with an offset in whole seconds, e.g. 2026-12-06T12:00:00Z"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{name}: {text!r} is not a time; {forms}") from None
    if "T" not in text.upper() or moment.tzinfo is None:
        raise ConfigError(f"{name}: {text!r} has no date and time with an offset; {forms}")
    if moment.microsecond:
        raise ConfigError(f"{name}: {text!r} has a fraction of a second; a tick is whole; {forms}")
    return moment.astimezone(UTC)


def tick_of_run(options: Options, now: datetime) -> ticks.Tick | None:
    """The tick `run` works, judged at its start (`now`, UTC); None without --schedule or
    --tick (a manual run). ConfigError (exit 78) when now is not within --tick-window of a
    schedule time, or --tick is ahead of now plus the skew."""
    if options.tick_at is not None:
        if options.tick_at > now + timedelta(seconds=options.skew):
            raise ConfigError(
                f"--tick: {ticks.format_tick(options.tick_at)} is ahead of now "
                f"({ticks.format_tick(now)}) by more than the skew "
                f"{format_duration(options.skew)}; a tick names a time that has come"
            )
        return ticks.Tick(options.tick_of, options.tick_at, "", options.run_id)
    if not options.schedule:
        return None
    from cronlock_sidecar.lock.schedule import latest_tick

    at = latest_tick(options.schedule, options.time_zone or None, now, options.tick_window)
    if at is None:
        zone = f" ({options.time_zone})" if options.time_zone else ""
        raise ConfigError(
            f"--schedule: no time of {options.schedule!r}{zone} within --tick-window "
            f"{format_duration(options.tick_window)} before now ({ticks.format_tick(now)}): this "
            "run did not start at a tick of its schedule; start it from cron at the schedule's "
            "times, name the tick with --tick, or widen --tick-window"
        )
    return ticks.Tick(options.tick_of, at, "", options.run_id)


def _tick_identity(values: _Values, job_name: str) -> tuple[str, str, str]:
    """--cronjob, --job-uid and --cluster, checked: a tick's record names them."""
    from cronlock_sidecar.lock.ticks import tick_of_job, valid_name

    cronjob, cronjob_name = values.get("cronjob")
    job_uid, job_uid_name = values.get("job_uid")
    cluster, cluster_name = values.get("cluster")
    if cronjob is not None and not valid_name(cronjob):
        raise ConfigError(
            f"{cronjob_name}: {cronjob!r} is not a CronJob's name; expected a DNS-1123 "
            "subdomain of at most 52 characters"
        )
    for text, name in ((job_uid, job_uid_name), (cluster, cluster_name)):
        if text is not None and not _IDENTITY.match(text):
            raise ConfigError(
                f"{name}: {text!r} is not valid; expected 1-253 printable characters without spaces"
            )
    if cronjob is not None and job_uid is None and tick_of_job(cronjob, job_name) is not None:
        raise ConfigError(
            f"{job_uid_name}: required: Job {job_name} works a tick of CronJob {cronjob}, and "
            f"its uid tells its own retry pods from another Job of the same tick (set "
            f"{contract.ENV_JOB_UID} from the label {contract.JOB_UID_LABEL})"
        )
    return cronjob or "", job_uid or "", cluster or ""


def _jitter(values: _Values) -> float:
    """--jitter, from 0 (none) to contract.MAX_JITTER_SECONDS."""
    jitter = values.duration("jitter", 0.0)
    if jitter > contract.MAX_JITTER_SECONDS:
        raise ConfigError(
            f"{values.get('jitter')[1]}: {format_duration(jitter)} is out of range; expected "
            f"0 (no jitter) to {format_duration(contract.MAX_JITTER_SECONDS)}"
        )
    return jitter


def _store(values: _Values) -> StoreUrl | None:
    """The store's URL from --store or the file --store-file names, checked against its kind."""
    text, name = values.get("store")
    path, path_name = values.get("store_file")
    if text is not None and path is not None:
        raise ConfigError(f"{name} and {path_name}: both set; give the URL one way")
    if path is not None:
        try:
            with open(path, "rb") as file:
                raw = file.read(STORE_FILE_LIMIT + 1)
        except OSError as error:
            raise ConfigError(
                f"{path_name}: cannot read {path}: {error.strerror}; is the Secret named by "
                f"{contract.ANNOTATION_STORE_SECRET} there, with the key "
                f"{contract.STORE_SECRET_URL_KEY!r}?"
            ) from None
        if len(raw) > STORE_FILE_LIMIT:
            raise ConfigError(f"{path_name}: {path} is over {STORE_FILE_LIMIT} bytes; not a URL")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{path_name}: {path} is not UTF-8 text; expected one URL") from None
        name = f"{path_name} ({path})"
    kind_text, kind_name = values.get("store_kind")
    kinds = tuple(kind for kind in contract.STORES if kind != "lease")
    if kind_text is not None and kind_text not in contract.STORES:
        raise ConfigError(f"{kind_name}: {kind_text!r} is not one of {', '.join(contract.STORES)}")
    if text is None:
        if kind_text in kinds:
            raise ConfigError(
                f"{kind_name}: {kind_text} asks for a store URL, but neither --store nor "
                "--store-file gives one"
            )
        return None
    try:
        store = parse_store_url(text, name)
    except StoreUrlError as error:
        raise ConfigError(str(error)) from None
    if kind_text is not None and kind_text != store.kind:
        raise ConfigError(
            f"{name}: {store} names a {store.kind} store, but {kind_name} is {kind_text}; "
            f"put a {kind_text} URL in the Secret or change {contract.ANNOTATION_STORE}"
        )
    return store
