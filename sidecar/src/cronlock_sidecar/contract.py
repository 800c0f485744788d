"""Names shared by the operator, the sidecar and users: one place so they cannot drift."""

from __future__ import annotations

# `Final` is for the type checker alone: typing costs the gate's start a few milliseconds,
# and the gate is on every guarded run's way to its work (docs/PERFORMANCE.md).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

# The release: the Python package's, the chart's and the images' version (pyproject.toml's;
# a unit test keeps the two equal). What `--version` says on every command.
VERSION: Final = "0.1.0"

# The supported version skew (docs/UPGRADING.md): an operator works with the sidecars of
# its own minor release and of the one before and after it, in the same major release.
SKEW_MINORS: Final = 1
# The release an injection made before injections carried ENV_OPERATOR_VERSION belongs to.
UNSTAMPED_VERSION: Final = "0.1.0"


def release_of(version: str) -> tuple[int, int] | None:
    """(major, minor) of "MAJOR.MINOR[.PATCH][-PRE][+BUILD]"; None for anything else."""
    parts = version.split("+", 1)[0].split("-", 1)[0].split(".")
    # ASCII digits only: str.isdigit() also accepts "²" or "٣", which int() refuses, and a
    # value a CronJob's editor can write must never make a reconcile or the sidecar crash.
    if not 2 <= len(parts) <= 3 or not all(
        part.isascii() and part.isdigit() and len(part) <= 6 for part in parts
    ):
        return None
    return int(parts[0]), int(parts[1])


def within_skew(one: str, other: str) -> bool:
    """Whether a sidecar and an operator of these versions are supported together: the same
    major release, at most SKEW_MINORS minor releases apart. A version that is none is not."""
    a, b = release_of(one), release_of(other)
    return a is not None and b is not None and a[0] == b[0] and abs(a[1] - b[1]) <= SKEW_MINORS


# --- annotations and labels on user objects ------------------------------------
PREFIX: Final = "cronlock.io/"
ANNOTATION_ENABLED: Final = PREFIX + "enabled"
ANNOTATION_LOCK: Final = PREFIX + "lock"
ANNOTATION_TTL: Final = PREFIX + "ttl"
ANNOTATION_RENEW: Final = PREFIX + "renew"
ANNOTATION_POLICY: Final = PREFIX + "policy"
ANNOTATION_WAIT_TIMEOUT: Final = PREFIX + "wait-timeout"
# Each run's work starts up to this long after its start: a delay uniform over [0, D),
# the same for every pod of one tick (lock/jitter.py); absent or "0": none.
ANNOTATION_JITTER: Final = PREFIX + "jitter"
# Longest jitter (1h): the gate, and the pod with its node's reservation, wait that long.
MAX_JITTER_SECONDS: Final = 3600
# Under `policy: queue`: how long a tick's Job may stay queued (suspended) before the
# operator deletes it (`QueueTimedOut`); the released pod waits for the lock as long.
ANNOTATION_QUEUE_TIMEOUT: Final = PREFIX + "queue-timeout"
ANNOTATION_STOP: Final = PREFIX + "stop"
ANNOTATION_ALERT_AFTER: Final = PREFIX + "alert-after"
ANNOTATION_KEEP_SKIPPED_JOBS: Final = PREFIX + "keep-skipped-jobs"
# The longest a run may hold its lock, counted from its acquire (absent or "0": no bound);
# past it the run is stopped as one that lost its lock (lock/maxhold.py).
ANNOTATION_MAX_HOLD: Final = PREFIX + "max-hold"
# After how many ticks without a successful run the operator warns `NotSucceeding`
# (0: never); the operator's --alert-after-missed is the default.
ANNOTATION_ALERT_AFTER_MISSED: Final = PREFIX + "alert-after-missed"
# The CronJobs (names, comma-separated) that may join this CronJob's lock: the consent a
# CronJob needs from one that already uses the lock before it may share it.
ANNOTATION_SHARE_LOCK_WITH: Final = PREFIX + "share-lock-with"
# Where the lock lives: "lease" (default, the cluster's coordination.k8s.io Lease), or a
# store shared across clusters, "redis" or "postgres", whose URL is in the Secret named by
# cronlock.io/store-secret (key "url") in the CronJob's namespace.
ANNOTATION_STORE: Final = PREFIX + "store"
ANNOTATION_STORE_SECRET: Final = PREFIX + "store-secret"
STORES: Final = ("lease", "redis", "postgres")
# How many runs may hold the lock at once, 1..MAX_PERMITS (lock/permits.py): on a CronJob
# what it asks (every CronJob sharing the lock asks the same), on the lock's document what
# the lock is (the operator writes it on the Lease).
ANNOTATION_PERMITS: Final = PREFIX + "permits"
# Written by the operator, never by users.
ANNOTATION_ORIGINAL_RESTART_POLICY: Final = PREFIX + "original-restart-policy"
# Set when `stop: signal` had to turn on shareProcessNamespace: "false" (the user wrote
# false) or "unset" (the user did not write it), so that revert restores it exactly.
ANNOTATION_ORIGINAL_SHARE_PROCESS_NAMESPACE: Final = PREFIX + "original-share-process-namespace"
# Set when injection lowered the pod's terminationGracePeriodSeconds to the kill grace:
# the user's whole number of seconds, or "unset" (the key was absent).
ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS: Final = (
    PREFIX + "original-termination-grace-period-seconds"
)
ANNOTATION_CONSECUTIVE_SKIPS: Final = PREFIX + "consecutive-skips"
# Written on the Lease by the sidecar when it releases.
ANNOTATION_LAST_HOLDER: Final = PREFIX + "last-holder"
ANNOTATION_RELEASED_AT: Final = PREFIX + "released-at"
# Written on the Lease by the holder at acquire: the Job whose pod holds it, so that the
# retry pod of the same Job may take over from its terminal predecessor at once.
ANNOTATION_HOLDER_JOB: Final = PREFIX + "holder-job"
# Contenders' notes: the only writes a pod that does not hold the Lease may make to it
# (the holders' admission policy allows each, valued with the writer's own identity).
# A run under `policy: replace` asks the holder to yield; one under `policy: observe`
# records that it ran while the Lease was held.
ANNOTATION_YIELD_TO: Final = PREFIX + "yield-to"
ANNOTATION_OVERLAP: Final = PREFIX + "overlap"
CONTENDER_NOTES: Final = (ANNOTATION_YIELD_TO, ANNOTATION_OVERLAP)
# Written on the Lease by a holder that yielded: who replaced it, and the latest replaced
# Jobs (newest first, comma-separated), so a replaced Job's retry pod skips instead of
# replacing the run that replaced it.
ANNOTATION_REPLACED_BY: Final = PREFIX + "replaced-by"
ANNOTATION_REPLACED_JOBS: Final = PREFIX + "replaced-jobs"
# A freeze of the lock (`cronlock freeze`): until when every run on it skips, who froze it
# (as the API server named the caller) and why. Only an identity allowed the verb `freeze`
# on the Lease may write them (the chart's lease-freeze policy).
ANNOTATION_FROZEN_UNTIL: Final = PREFIX + "frozen-until"
ANNOTATION_FROZEN_BY: Final = PREFIX + "frozen-by"
ANNOTATION_FROZEN_REASON: Final = PREFIX + "frozen-reason"
# "true" (`cronlock freeze --stop-running`): the run working on the lock stops too, at its
# next renewal, and gives the lock back once stopped.
ANNOTATION_FROZEN_STOP: Final = PREFIX + "frozen-stop"
FREEZE_NOTES: Final = (
    ANNOTATION_FROZEN_UNTIL,
    ANNOTATION_FROZEN_BY,
    ANNOTATION_FROZEN_REASON,
    ANNOTATION_FROZEN_STOP,
)
FREEZE_VERB: Final = "freeze"
REPLACED_JOBS_KEPT: Final = 10
# Written on a Job by the operator: its run overlapped a held Lease (observe policy), or
# was replaced by a newer run; the value names the other run.
JOB_ANNOTATION_OVERLAPPED: Final = PREFIX + "overlapped"
JOB_ANNOTATION_REPLACED_BY: Final = PREFIX + "replaced-by"
# Written on a queued Job by the operator when it stayed queued past its queue-timeout
# (policy: queue); the run accounting then counts it as a skip and deletes it.
JOB_ANNOTATION_QUEUE_TIMED_OUT: Final = PREFIX + "queue-timed-out"

USER_SETTINGS: Final = frozenset(
    {
        ANNOTATION_ENABLED,
        ANNOTATION_LOCK,
        ANNOTATION_TTL,
        ANNOTATION_RENEW,
        ANNOTATION_POLICY,
        ANNOTATION_QUEUE_TIMEOUT,
        ANNOTATION_WAIT_TIMEOUT,
        ANNOTATION_JITTER,
        ANNOTATION_STOP,
        ANNOTATION_ALERT_AFTER,
        ANNOTATION_ALERT_AFTER_MISSED,
        ANNOTATION_KEEP_SKIPPED_JOBS,
        ANNOTATION_MAX_HOLD,
        ANNOTATION_PERMITS,
        ANNOTATION_SHARE_LOCK_WITH,
        ANNOTATION_STORE,
        ANNOTATION_STORE_SECRET,
    }
)
OPERATOR_OWNED: Final = frozenset(
    {
        ANNOTATION_ORIGINAL_RESTART_POLICY,
        ANNOTATION_ORIGINAL_SHARE_PROCESS_NAMESPACE,
        ANNOTATION_ORIGINAL_TERMINATION_GRACE_PERIOD_SECONDS,
        ANNOTATION_CONSECUTIVE_SKIPS,
    }
)

# Every denial of the chart's holders' admission policy starts so (charts/cronlock/
# templates/admission-policy.yaml): a pod that may not take an expired hold over waits
# for the operator to clear it instead of failing.
HOLDER_POLICY_DENIAL: Final = "cronlock holder policy:"

LABEL_LOCK: Final = PREFIX + "lock"
# On a finished Job whose failure is cronlock's doing, not the work's: "skipped" (the lock
# was held) or "replaced" (a newer run took the lock over), so that alerts on failed Jobs
# (kube-prometheus' KubeJobFailed) can leave them out.
LABEL_OUTCOME: Final = PREFIX + "outcome"
LABELLED_OUTCOMES: Final = ("skipped", "replaced")
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "cronlock"
# On a Namespace: every CronJob in it is guarded unless its own cronlock.io/enabled says
# "false" (the same key as the CronJob's annotation, as Istio's and Linkerd's injection
# labels). Only "true" opts in.
LABEL_NAMESPACE_ENABLED: Final = ANNOTATION_ENABLED
NAMESPACE_SELECTOR: Final = LABEL_NAMESPACE_ENABLED + "=true"

# --- Lease ---------------------------------------------------------------------
LEASE_PREFIX: Final = "cronlock-"
HOLDER_ROLE: Final = "cronlock-holder"


def lease_name(lock: str) -> str:
    """The Lease that backs a lock."""
    return LEASE_PREFIX + lock


def lock_of(lease: str, label: str | None = None) -> str:
    """The lock a Lease backs: its `cronlock.io/lock` label, else lease_name's inverse (a
    Lease made before the label existed)."""
    return label or lease.removeprefix(LEASE_PREFIX)


# An injected sidecar's holder identity: `<pod name>_<first 8 characters of the pod's uid>`.
# The holders' admission policy builds the same from a pod-bound token's claims
# (charts/cronlock/templates/admission-policy.yaml, `variables.me`); tests pin the two.
IDENTITY_UID_CHARS: Final = 8


def holder_identity(pod_name: str, pod_uid: str) -> str:
    """The identity the sidecar of pod `pod_name` (uid `pod_uid`) holds its Lease as."""
    return f"{pod_name}_{pod_uid[:IDENTITY_UID_CHARS]}"


def identity_pod(identity: str) -> str:
    """The pod a holder identity names ("" for one that names no pod, e.g. `run`'s)."""
    return identity.rpartition("_")[0]


# --- the injected pod -------------------------------------------------------------
SIDECAR_CONTAINER: Final = "cronlock"
GATE_CONTAINER: Final = "cronlock-gate"
INJECTED_CONTAINERS: Final = frozenset({SIDECAR_CONTAINER, GATE_CONTAINER})
VOLUME_NAME: Final = "cronlock"
RUN_DIR: Final = "/var/run/cronlock"
FENCING_TOKEN_FILE: Final = "fencing-token"  # noqa: S105 (a file name)
LEASE_FILE: Final = "lease.json"
DECISION_FILE: Final = "decision"
# The tick this run works, the one claimed before it and the last successful one on the
# lock (lock/ticks.py), as `KEY=value` lines the work may source; written before the gate
# opens.
TICK_FILE: Final = "tick.env"
# Decision "already-ran": the sidecar's skip line, which the gate writes to its
# termination message (TERMINATION_LOG) for the operator to read from the pod's status.
SKIP_LINE_FILE: Final = "skip-line"
# A manual run's jitter (lock/jitter.py), drawn once per pod: "<start> <offset>" (seconds
# since the epoch, seconds), so that a restarted sidecar waits for the same instant.
JITTER_FILE: Final = "jitter"
TERMINATION_LOG: Final = "/dev/termination-log"
# The gate gives up this long after the longest the sidecar may wait to decide (its
# jitter and its wait timeout).
GATE_TIMEOUT_AFTER_WAIT_SECONDS: Final = 60
SIDECAR_PORT: Final = 8484
HELD_PATH: Final = "/held"
# A store's Secret is mounted here, into the sidecar only (never the gate or the work).
STORE_VOLUME_NAME: Final = "cronlock-store"
STORE_DIR: Final = "/var/run/cronlock-store"
STORE_SECRET_URL_KEY: Final = "url"  # noqa: S105 (a key name)
STORE_URL_FILE: Final = STORE_DIR + "/" + STORE_SECRET_URL_KEY
# A lock in a store: the work says its tick succeeded by creating SUCCESS_FILE (tick.env's
# CRONLOCK_SUCCESS_FILE) in an emptyDir of its own, writable by the work's containers and
# mounted read-only into the sidecar, whose release then records the tick's success on the
# lock (lock/ticks.py). On a Lease the operator records it when the Job completes.
SUCCESS_VOLUME_NAME: Final = "cronlock-success"
SUCCESS_DIR: Final = "/var/run/cronlock-success"
SUCCESS_FILE: Final = SUCCESS_DIR + "/succeeded"

# --- exit codes (sysexits.h) -------------------------------------------------------
EXIT_OK: Final = 0
EXIT_SKIPPED: Final = 75  # EX_TEMPFAIL: the lock is held by a live run
EXIT_UNAVAILABLE: Final = 69  # EX_UNAVAILABLE: API unreachable or forbidden
EXIT_SOFTWARE_LOST: Final = 70  # EX_SOFTWARE: the lease was lost during the run
EXIT_CONFIG: Final = 78  # EX_CONFIG: bad configuration
# `run`: the command held the lock past --max-hold and was stopped (sysexits' number 76,
# EX_PROTOCOL, otherwise unused by cronlock; a command that exits 76 itself reads the same).
EXIT_MAX_HOLD: Final = 76

# --- environment twins of the sidecar's flags ----------------------------------------
ENV_PREFIX: Final = "CRONLOCK_"
ENV_LEASE: Final = "CRONLOCK_LEASE"
ENV_TTL: Final = "CRONLOCK_TTL"
ENV_RENEW: Final = "CRONLOCK_RENEW"
ENV_POLICY: Final = "CRONLOCK_POLICY"
ENV_WAIT_TIMEOUT: Final = "CRONLOCK_WAIT_TIMEOUT"
ENV_JITTER: Final = "CRONLOCK_JITTER"
ENV_IDENTITY: Final = "CRONLOCK_IDENTITY"
ENV_SKEW: Final = "CRONLOCK_SKEW"
ENV_STOP: Final = "CRONLOCK_STOP"
ENV_KILL_GRACE: Final = "CRONLOCK_KILL_GRACE"
ENV_MAX_HOLD: Final = "CRONLOCK_MAX_HOLD"
ENV_PORT: Final = "CRONLOCK_PORT"
ENV_RUN_DIR: Final = "CRONLOCK_RUN_DIR"
ENV_POD_NAME: Final = "CRONLOCK_POD_NAME"
ENV_POD_UID: Final = "CRONLOCK_POD_UID"
ENV_POD_NAMESPACE: Final = "CRONLOCK_POD_NAMESPACE"
ENV_JOB_NAME: Final = "CRONLOCK_JOB_NAME"
# Each tick at most once (lock/ticks.py): the CronJob whose ticks the run works (the
# operator writes its name), the Job's uid (a retry pod of the same Job is the same run),
# and the cluster's name (the chart's clusterName) that `cronlock status` names.
ENV_CRONJOB: Final = "CRONLOCK_CRONJOB"
ENV_JOB_UID: Final = "CRONLOCK_JOB_UID"
ENV_CLUSTER: Final = "CRONLOCK_CLUSTER"
# What the work reads in tick.env (or its environment under `run`).
ENV_TICK: Final = "CRONLOCK_TICK"
ENV_PREVIOUS_TICK: Final = "CRONLOCK_PREVIOUS_TICK"
ENV_MANUAL: Final = "CRONLOCK_MANUAL"
# The tick of the lock's success record (ANNOTATION_SUCCEEDED_PREFIX) as read at the claim:
# the work processes (last success, this tick]; "" when none is recorded.
ENV_LAST_SUCCESS_TICK: Final = "CRONLOCK_LAST_SUCCESS_TICK"
# tick.env in a pod on a store lock, for a tick's run: the file the work creates when it
# succeeded (SUCCESS_FILE); "" where the work need not (a Lease lock, a manual run).
ENV_SUCCESS_FILE: Final = "CRONLOCK_SUCCESS_FILE"
# `run` outside Kubernetes names its tick itself: --schedule (and --time-zone,
# --tick-window) or --tick, whose ticks (--tick-of) and its run id. --tick's twin is not
# CRONLOCK_TICK: that is what the work is told, and a command run under `run` that runs
# `cronlock-sidecar run` itself must not claim its parent's tick on another lock unasked.
ENV_SCHEDULE: Final = "CRONLOCK_SCHEDULE"
ENV_TIME_ZONE: Final = "CRONLOCK_TIME_ZONE"
ENV_TICK_WINDOW: Final = "CRONLOCK_TICK_WINDOW"
ENV_TICK_AT: Final = "CRONLOCK_TICK_AT"
ENV_TICK_OF: Final = "CRONLOCK_TICK_OF"
ENV_RUN_ID: Final = "CRONLOCK_RUN_ID"
DEFAULT_TICK_WINDOW_SECONDS: Final = 60
# The gate's termination message file (default TERMINATION_LOG).
ENV_TERMINATION_LOG: Final = "CRONLOCK_TERMINATION_LOG"
ENV_FENCING_TOKEN: Final = "CRONLOCK_FENCING_TOKEN"  # noqa: S105 (a variable name)
ENV_LOG_FORMAT: Final = "CRONLOCK_LOG_FORMAT"
ENV_LOG_LEVEL: Final = "CRONLOCK_LOG_LEVEL"
LOG_FORMATS: Final = ("plain", "json")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
# The lock store: the Lease (default), or Redis/PostgreSQL shared across clusters. The URL
# (with its credentials) comes from a file the Secret is mounted as, or for `run` from
# CRONLOCK_STORE; CRONLOCK_STORE_KIND is what the CronJob asked for, checked against it.
ENV_STORE: Final = "CRONLOCK_STORE"
ENV_STORE_FILE: Final = "CRONLOCK_STORE_FILE"
ENV_STORE_KIND: Final = "CRONLOCK_STORE_KIND"
# Written by the operator into the sidecar's environment: the operator's own release. The
# sidecar warns at start when its release is outside the skew with it; the operator posts
# SidecarVersionSkew on a CronJob whose injection came from a release outside its skew.
ENV_OPERATOR_VERSION: Final = "CRONLOCK_OPERATOR_VERSION"

# Job label the Job controller puts on its pods; an earlier pod of the same Job may be
# taken over at once (the retry pod only exists once the earlier one is terminal).
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
JOB_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"

# --- ticks (lock/ticks.py) ------------------------------------------------------------
# On the lock's document, one per CronJob: the last tick claimed, by which Job and run.
ANNOTATION_TICK_PREFIX: Final = PREFIX + "tick."
# On the lock's document, one per CronJob, in the same format: the newest tick whose run
# succeeded. Written by the operator (a Lease in a cluster) or `run` (at its release),
# never by a pod; the holders' policy and the stores' rules refuse any other writer.
ANNOTATION_SUCCEEDED_PREFIX: Final = PREFIX + "succeeded."
# Permits (lock/permits.py): the lock's N is ANNOTATION_PERMITS (with the user settings);
# permit K ≥ 1's entry on the lock's document; permit 0 is the Lease's spec.
ANNOTATION_PERMIT_PREFIX: Final = PREFIX + "permit."
MAX_PERMITS: Final = 16
# `run --permits N` (the N it requires of its lock), and the permit a run holds, told to
# the work (tick.env, `run`'s command): its fencing token is that permit's, so a
# downstream store fences by the pair (permit, token).
ENV_PERMITS: Final = "CRONLOCK_PERMITS"
ENV_PERMIT: Final = "CRONLOCK_PERMIT"
# The skip line of a run whose tick was already worked, and the Event the operator posts.
ALREADY_RAN: Final = "already ran"
EVENT_TICK_ALREADY_RAN: Final = "TickAlreadyRan"
# The line a sidecar that stopped its run at cronlock.io/max-hold writes to its container's
# termination message (TERMINATION_LOG), and the Warning the operator posts on reading it.
MAX_HOLD_EXCEEDED: Final = "max-hold exceeded"
EVENT_MAX_HOLD_EXCEEDED: Final = "MaxHoldExceeded"

DEFAULT_TTL_SECONDS: Final = 60
DEFAULT_SKEW_SECONDS: Final = 2
DEFAULT_ALERT_AFTER: Final = 3
DEFAULT_ALERT_AFTER_MISSED: Final = 3
# What a run does when it finds the lock held: skip it, wait for it, replace its holder,
# (observe) run anyway and record the overlap, or (queue) wait as a suspended Job, with
# no pod, until the operator lets it go (docs/USAGE.md, "Queue instead of skip").
POLICIES: Final = ("skip", "wait", "replace", "observe", "queue")
# What the operator's --default-policy may be: not queue, which suspends a CronJob's Jobs
# (a choice its author makes, with its queue-timeout, never a cluster-wide default).
DEFAULT_POLICIES: Final = ("skip", "wait", "replace", "observe")
# Policies whose run, finding the lock held, waits for it in its pod (up to its timeout).
WAITING_POLICIES: Final = ("wait", "replace", "queue")
# The operator's Events about queued Jobs (policy: queue).
EVENT_QUEUE_COLLAPSED: Final = "Collapsed"
EVENT_QUEUE_TIMED_OUT: Final = "QueueTimedOut"
EVENT_QUEUE_RELEASED: Final = "Dequeued"
