"""One lock of N permits against N locks of one permit: the renewals' conflicts and cost.

    .venv/bin/python -m tests.benchmarks permits [--sizes 2,4,8,16] [--pairs 2] [--duration 15]

All N permits of a lock live in its one Lease (lock/permits.py), so its N holders race:
a renewal written on a version another holder has replaced since is refused (409), read
again and written again (`LeaseKeeper._renew_after_conflict`, at most MAX_CONFLICTS times
in a row, then the renewal fails). The baseline is the same N holders on N Leases of one
permit each: the same renewals, nothing shared. docs/DECISIONS.md left the bound on N
(MAX_PERMITS, 16) to this measurement.

Each holder is the sidecar's own `LeaseKeeper` on its own `KubeLeaseClient` (the HTTP
client `hold` uses, one connection each), renewed by its own `Heartbeat` thread, all in
this process. Only the measuring is added: each renewal is timed, from the heartbeat's
call until the write is accepted, and the keeper's requests and 409s are counted. At the
start of a phase the N holders claim at once, as N runs of one tick would, each renewing
from its own claim on, as `hold` does (`--together`: all from one instant once all have
claimed, as after an API-server pause), at the operator's shortest renew period (1 s, ttl
19 s: the most renewals a second it admits); `--duration` seconds after the last claim
they stop and release. Phases alternate, permits and baseline, each on new Leases, the
order swapped every pair. The API server's own count
(`apiserver_request_total{resource="leases"}`) is read after the claims and after the
renewals; its background (its identity Lease, the controller manager's election) is
counted with nothing running and taken off. Writes `.testenv/bench/permits.json`. A
benchmark, not a test: docs/PERFORMANCE.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shlex
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from cronlock_operator.cronjob.timing import MIN_RENEW_SECONDS, minimum_ttl_seconds
from cronlock_sidecar.contract import DEFAULT_SKEW_SECONDS, MAX_PERMITS
from cronlock_sidecar.holding.heartbeat import Heartbeat
from cronlock_sidecar.holding.lease import (
    MAX_CONFLICTS,
    Acquired,
    LeaseKeeper,
    RenewOutcome,
    RenewResult,
    SystemClock,
)
from cronlock_sidecar.lock.model import Timing, TimingError
from cronlock_sidecar.transport.kubeapi import KubeLeaseClient
from cronlock_sidecar.transport.kubeconfig import Cluster, from_kubeconfig
from cronlock_sidecar.transport.seam import Conflict, Lease, LeaseRef, Unavailable
from tests.benchmarks import BENCH_DIR, controlplane, machine, table
from tests.benchmarks.renewals import difference, lease_requests
from tests.support.controlplane import ControlPlane
from tests.support.paths import ROOT

KINDS = ("permits", "baseline")
SIZES = (2, 4, 8, 16)


# --- the holders -------------------------------------------------------------------------
class CountingClient:
    """The sidecar's Lease client, counting what its keeper asks of it; nothing else changes.

    One keeper, one client: a keeper's claim and its renewals run on one thread at a
    time, so the counts need no lock."""

    def __init__(self, client: KubeLeaseClient) -> None:
        self.client = client
        self.reads = 0
        self.writes = 0
        self.conflicts = 0

    def get(self, lease: LeaseRef, *, timeout: float | None = None) -> Lease:
        self.reads += 1
        return self.client.get(lease, timeout=timeout)

    def create(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        self.writes += 1
        try:
            return self.client.create(lease, body, timeout=timeout)
        except Conflict:
            self.conflicts += 1
            raise

    def replace(self, lease: LeaseRef, body: Lease, *, timeout: float | None = None) -> Lease:
        self.writes += 1
        try:
            return self.client.replace(lease, body, timeout=timeout)
        except Conflict:
            self.conflicts += 1
            raise

    def close(self) -> None:
        self.client.close()


class Renewal(NamedTuple):
    """One call of `renew()` by the heartbeat: its outcome, how long until it returned, the
    409s it met and the reads it made again after them."""

    outcome: str
    seconds: float
    conflicts: int
    rereads: int


class Claim(NamedTuple):
    """One holder's claim at the phase's start; `refused`: why `try_acquire` gave up
    (MAX_CONFLICTS 409s in a row, or the API server), "" when it took a permit."""

    seconds: float
    conflicts: int
    refused: str


class MeasuredKeeper(LeaseKeeper):
    """The sidecar's keeper, its renewals timed and their 409s counted."""

    def __init__(
        self,
        client: CountingClient,
        lease: LeaseRef,
        identity: str,
        timing: Timing,
        permits: int | None,
    ) -> None:
        # `permits`: the N `run --permits N` writes on a lock that has none, as the
        # operator would; None for a lock of one permit.
        super().__init__(client, lease, identity, timing, SystemClock(), permits=permits)
        self.client = client
        self.renewals: list[Renewal] = []
        self.heartbeat = Heartbeat(self)

    def renew(self) -> RenewResult:
        conflicts, reads = self.client.conflicts, self.client.reads
        started = time.monotonic()
        result = super().renew()
        self.renewals.append(
            Renewal(
                result.outcome.value,
                time.monotonic() - started,
                self.client.conflicts - conflicts,
                self.client.reads - reads,
            )
        )
        return result

    def claim(self) -> Claim:
        """`try_acquire` once, as `hold` does: MAX_CONFLICTS 409s end it (`Unavailable`)."""
        conflicts = self.client.conflicts
        started = time.monotonic()
        try:
            result = self.try_acquire()
        except Unavailable as error:
            return Claim(time.monotonic() - started, self.client.conflicts - conflicts, str(error))
        if not isinstance(result, Acquired):
            raise RuntimeError(f"{self.identity} found {self.lease} busy: {result.message()}")
        return Claim(time.monotonic() - started, self.client.conflicts - conflicts, "")


def keepers(
    kind: str, size: int, namespace: str, cluster: Cluster, timing: Timing
) -> list[MeasuredKeeper]:
    """N holders: of one lock of N permits, or each of its own lock of one permit."""
    tag = f"{size}-{secrets.token_hex(3)}"
    if kind == "permits":
        leases = [LeaseRef(namespace, f"cronlock-permits-{tag}")] * size
    else:
        leases = [LeaseRef(namespace, f"cronlock-one-{tag}-{index}") for index in range(size)]
    # The sidecar's own request timeout for this renew period (cli.py `_transport`).
    timeout = min(5.0, max(1.0, timing.renew))
    return [
        MeasuredKeeper(
            CountingClient(KubeLeaseClient(cluster, timeout=timeout)),
            lease,
            f"bench-{kind}-{tag}-{index}",
            timing,
            size if kind == "permits" else None,
        )
        for index, lease in enumerate(leases)
    ]


def claim_at_once(holders: Sequence[MeasuredKeeper], *, renew: bool) -> list[Claim]:
    """Every holder claims at the same instant (a barrier) and, if `renew`, starts renewing
    as soon as its own claim is written, as `hold` does. A refused claim is counted and
    made again afterwards, one at a time, so that all N renew."""
    barrier = threading.Barrier(len(holders))

    def claim(holder: MeasuredKeeper) -> Claim:
        barrier.wait(timeout=30)
        claimed = holder.claim()
        if renew and not claimed.refused:
            holder.heartbeat.start()
        return claimed

    with ThreadPoolExecutor(max_workers=len(holders)) as pool:
        claims = list(pool.map(claim, holders, timeout=60))
    for holder, each in zip(holders, claims, strict=True):
        if not each.refused:
            continue
        if holder.claim().refused:
            raise RuntimeError(f"{holder.identity} was refused twice: {each.refused}")
        if renew:
            holder.heartbeat.start()
    return claims


# --- one phase ---------------------------------------------------------------------------
def phase(
    plane: ControlPlane,
    kind: str,
    size: int,
    pair: int,
    args: argparse.Namespace,
    namespace: str,
    cluster: Cluster,
) -> dict[str, Any]:
    """N holders claim at once, renew for `--duration` seconds, release; what it took."""
    holders = keepers(kind, size, namespace, cluster, args.timing)
    try:
        claims = claim_at_once(holders, renew=not args.together)
        # The rate's window is between the two reads of the API server's count: under
        # --together no renewal comes before it, else the first may.
        before = lease_requests(plane)
        started = time.monotonic()
        if args.together:
            for holder in holders:
                holder.heartbeat.start()
        time.sleep(args.duration)
        for holder in holders:
            holder.heartbeat.stop(join_timeout=0)  # all told first, then waited for
        for holder in holders:
            holder.heartbeat.stop(join_timeout=10)
        window = time.monotonic() - started
        after = lease_requests(plane)
        released = sum(holder.release() for holder in holders)
    finally:
        # A phase that failed part way still stops every renew loop it started.
        for holder in holders:
            holder.heartbeat.stop(join_timeout=0)
        for holder in holders:
            holder.client.close()
    renewals = [renewal for holder in holders for renewal in holder.renewals]
    if not any(renewal.outcome == RenewOutcome.RENEWED.value for renewal in renewals):
        raise RuntimeError(f"{kind} N={size}: no renewal done in {window:.1f}s")
    return {
        "kind": kind,
        "size": size,
        "pair": pair,
        "window_seconds": window,
        "claims": [each._asdict() for each in claims],
        "renewals": [each._asdict() for each in renewals],
        "lost": sum(holder.lost for holder in holders),
        "released": released,
        "requests": {
            f"{verb} {code}": count for (verb, code), count in difference(after, before).items()
        },
    }


def background(plane: ControlPlane, seconds: float) -> dict[str, float]:
    """Lease requests a second by verb and code while nothing of ours runs."""
    before = lease_requests(plane)
    started = time.monotonic()
    time.sleep(seconds)
    counted = difference(lease_requests(plane), before)
    window = time.monotonic() - started
    return {f"{verb} {code}": count / window for (verb, code), count in sorted(counted.items())}


# --- figures -------------------------------------------------------------------------------
def percentile(values: Sequence[float], share: int) -> float:
    """The `share`th percentile (inclusive method: a small sample stays within its range)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[share - 1]


def figures(phases: Sequence[Mapping[str, Any]], rate: Mapping[str, float]) -> dict[str, Any]:
    """One configuration over its phases: renewals, 409s, latency, the API server's rates
    (background taken off)."""
    renewals = [each for one in phases for each in one["renewals"]]
    renewed = [each for each in renewals if each["outcome"] == RenewOutcome.RENEWED.value]
    claims = [each for one in phases for each in one["claims"]]
    window = sum(one["window_seconds"] for one in phases)
    requests: Counter[str] = Counter()
    for one in phases:
        requests.update(one["requests"])
    net = {key: requests[key] - rate.get(key, 0.0) * window for key in sorted(requests)}
    # The API server's verbs as its metric names them: a renewal is a PUT, a claim of a
    # missing Lease a POST.
    writes = sum(count for key, count in net.items() if key.split()[0] in {"PUT", "POST"})
    refused = sum(
        count for key, count in net.items() if key.split()[0] == "PUT" and key.endswith(" 409")
    )
    latencies = [each["seconds"] * 1000 for each in renewed]
    return {
        "renewals": len(renewed),
        "renewals_not_done": len(renewals) - len(renewed),
        "lost": sum(one["lost"] for one in phases),
        "conflicts_per_renewal": sum(each["conflicts"] for each in renewals) / len(renewals),
        "rereads_per_renewal": sum(each["rereads"] for each in renewals) / len(renewals),
        "most_conflicts_in_one_renewal": max(each["conflicts"] for each in renewals),
        "latency_ms": {
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies),
        },
        "writes_per_second": writes / window,
        "conflicts_per_second": refused / window,
        "requests_per_second": sum(net.values()) / window,
        "requests_net": net,
        "claims": {
            "conflicts_per_claim": sum(each["conflicts"] for each in claims) / len(claims),
            "most_conflicts_in_one_claim": max(each["conflicts"] for each in claims),
            "refused": sum(bool(each["refused"]) for each in claims),
            "n": len(claims),
        },
    }


def ratio(permits: float, baseline: float) -> float | None:
    return permits / baseline if baseline > 0 else None


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def report(results: Mapping[str, Any]) -> str:
    config_rows = []
    for size in results["sizes"]:
        for kind in KINDS:
            each = results["by_size"][str(size)][kind]
            config_rows.append(
                [
                    str(size),
                    kind,
                    str(each["renewals"]),
                    str(each["renewals_not_done"]),
                    f"{each['conflicts_per_renewal']:.2f}",
                    f"{each['rereads_per_renewal']:.2f}",
                    str(each["most_conflicts_in_one_renewal"]),
                    f"{each['latency_ms']['p50']:.1f}",
                    f"{each['latency_ms']['p99']:.1f}",
                    f"{each['writes_per_second']:.2f}",
                    f"{each['conflicts_per_second']:.2f}",
                    f"{each['requests_per_second']:.2f}",
                    f"{each['claims']['conflicts_per_claim']:.2f} / "
                    f"{each['claims']['most_conflicts_in_one_claim']} / "
                    f"{each['claims']['refused']}",
                ]
            )
    first = table(
        [
            "N",
            "lock",
            "renewals",
            "not done",
            "409/renewal",
            "re-reads/renewal",
            "most 409s in one",
            "p50 ms",
            "p99 ms",
            "writes/s",
            "of them 409/s",
            "requests/s",
            "claims: 409/claim / most / refused",
        ],
        config_rows,
    )
    pair_rows = [
        [
            str(each["size"]),
            str(each["pair"] + 1),
            f"{each['renewals'][0]} / {each['renewals'][1]}",
            f"{each['conflicts_per_renewal'][0]:.2f} / {each['conflicts_per_renewal'][1]:.2f}",
            _times(ratio(*each["p50_ms"])),
            _times(ratio(*each["p99_ms"])),
            _times(ratio(*each["writes_per_second"])),
            _times(ratio(*each["requests_per_second"])),
        ]
        for each in results["pairs"]
    ]
    second = table(
        [
            "N",
            "pair",
            "renewals permits / baseline",
            "409/renewal permits / baseline",
            "p50 ratio",
            "p99 ratio",
            "writes/s ratio",
            "requests/s ratio",
        ],
        pair_rows,
    )
    return f"{first}\n\n{second}"


def pair_figures(
    permits: Mapping[str, Any], baseline: Mapping[str, Any], rate: Mapping[str, float]
) -> dict[str, Any]:
    """One pair's two phases side by side: (permits, baseline) for each figure."""
    mine, theirs = figures([permits], rate), figures([baseline], rate)
    return {
        "size": permits["size"],
        "pair": permits["pair"],
        "renewals": (mine["renewals"], theirs["renewals"]),
        "conflicts_per_renewal": (
            mine["conflicts_per_renewal"],
            theirs["conflicts_per_renewal"],
        ),
        "p50_ms": (mine["latency_ms"]["p50"], theirs["latency_ms"]["p50"]),
        "p99_ms": (mine["latency_ms"]["p99"], theirs["latency_ms"]["p99"]),
        "writes_per_second": (mine["writes_per_second"], theirs["writes_per_second"]),
        "requests_per_second": (mine["requests_per_second"], theirs["requests_per_second"]),
    }


def run(plane: ControlPlane, args: argparse.Namespace) -> dict[str, Any]:
    namespace = f"bench-permits-{secrets.token_hex(3)}"
    plane.kubectl("create", "namespace", namespace)
    cluster = from_kubeconfig([plane.kubeconfig])
    timing: Timing = args.timing
    results: dict[str, Any] = {
        "namespace": namespace,
        "sizes": args.sizes,
        "ttl_seconds": timing.ttl,
        "renew_seconds": timing.renew,
        "renew_deadline_seconds": timing.renew_deadline,
        "duration_seconds": args.duration,
        "together": args.together,
        "max_conflicts": MAX_CONFLICTS,
    }
    phases: list[dict[str, Any]] = []
    try:
        print(f"background: {args.baseline:g}s with nothing running ...", flush=True)
        results["background_per_second"] = rate = background(plane, args.baseline)
        for size in args.sizes:
            for pair in range(args.pairs):
                # Swapped every pair, so that neither kind always runs first.
                order = KINDS if pair % 2 == 0 else KINDS[::-1]
                for kind in order:
                    print(
                        f"N={size} pair {pair + 1}/{args.pairs}: {kind}, "
                        f"{args.duration:g}s at renew {timing.renew:g}s ...",
                        flush=True,
                    )
                    phases.append(phase(plane, kind, size, pair, args, namespace, cluster))
    finally:
        plane.kubectl("delete", "namespace", namespace, "--wait=false")
    results["phases"] = phases

    def of(kind: str, size: int, pair: int | None = None) -> list[dict[str, Any]]:
        return [
            each
            for each in phases
            if each["kind"] == kind and each["size"] == size and pair in (None, each["pair"])
        ]

    results["by_size"] = {
        str(size): {kind: figures(of(kind, size), rate) for kind in KINDS} for size in args.sizes
    }
    results["pairs"] = [
        pair_figures(of("permits", size, pair)[0], of("baseline", size, pair)[0], rate)
        for size in args.sizes
        for pair in range(args.pairs)
    ]
    print(report(results), flush=True)
    return results


def commit() -> str:
    """The commit measured, `+` when the tree differs from it."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    return head + ("+" if dirty else "")


def sizes(text: str) -> list[int]:
    values = [int(value) for value in text.split(",")]
    if any(not 2 <= value <= MAX_PERMITS for value in values):
        raise argparse.ArgumentTypeError(f"each N from 2 to {MAX_PERMITS}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks permits", description=__doc__.splitlines()[0]
    )
    shortest_ttl = minimum_ttl_seconds(DEFAULT_SKEW_SECONDS)
    parser.add_argument(
        "--sizes", type=sizes, default=list(SIZES), help="the N measured (2,4,8,16)"
    )
    parser.add_argument("--pairs", type=int, default=2, help="permits, baseline pairs per N (2)")
    parser.add_argument("--duration", type=float, default=15, help="seconds each phase renews (15)")
    parser.add_argument(
        "--ttl",
        type=float,
        default=shortest_ttl,
        help=f"ttl in seconds ({shortest_ttl}: the operator's shortest)",
    )
    parser.add_argument(
        "--renew",
        type=float,
        default=MIN_RENEW_SECONDS,
        help=f"renew period in seconds ({MIN_RENEW_SECONDS:g}: the operator's shortest)",
    )
    parser.add_argument(
        "--baseline", type=float, default=10, help="seconds to count the background (10)"
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="every holder starts renewing at the same instant once all have claimed (as "
        "after an API-server pause, when every retry lands at once), not each at its own "
        "claim as `hold` does",
    )
    parser.add_argument(
        "--output", type=Path, default=BENCH_DIR, help=f"JSON and control plane files ({BENCH_DIR})"
    )
    parser.add_argument(
        "--keep-controlplane", action="store_true", help="leave the control plane running"
    )
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs: at least 1")
    if args.baseline <= 0:
        parser.error("--baseline: more than 0 seconds")
    if args.duration < 2 * args.renew:
        parser.error("--duration: at least two renew periods")
    args.timing = Timing.of(args.ttl, args.renew)
    try:
        args.timing.check()
    except TimingError as error:
        parser.error(f"--ttl/--renew: {error}")
    command = shlex.join(["python", "-m", "tests.benchmarks", "permits", *(argv or [])])
    args.output.mkdir(parents=True, exist_ok=True)
    measured = commit()
    with controlplane(args.output, keep=args.keep_controlplane) as plane:
        results = run(plane, args)
    document = {
        "benchmark": "permits",
        "command": command,
        "commit": measured,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "results": results,
    }
    path = args.output / "permits.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}", flush=True)
    return 0
