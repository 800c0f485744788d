"""`cronlock status` on the command line: flags, exit codes, one shot or `--watch`."""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple

from cronlock_operator.cronjob.reading import Readings
from cronlock_operator.freeze import commands as freezing
from cronlock_operator.kube.errors import APIError, NoConfiguration
from cronlock_operator.lint import cli as lint
from cronlock_operator.status import completion
from cronlock_operator.status.api import (
    LEASE_SELECTOR,
    Cluster,
    Collection,
    Overrides,
    UsageError,
    connect,
    fetch,
    follow,
    labelled_namespaces,
    unannotated,
)
from cronlock_operator.status.model import (
    EXIT_OK,
    Change,
    Mirror,
    StatusRow,
    exit_code,
    rows,
    stored_locks,
)
from cronlock_operator.status.render import (
    as_list,
    printable,
    render_json,
    render_table,
    render_yaml,
)
from cronlock_operator.status.stores import StoredLock, read_stores
from cronlock_sidecar import contract
from cronlock_sidecar.lock.durations import DurationError, parse_duration

Output = Literal["table", "wide", "json", "yaml", "name"]
OUTPUTS: Final = ("table", "wide", "json", "yaml", "name")

EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = contract.EXIT_UNAVAILABLE
# --watch redraws when a CronJob or Lease changes, at most once a second (a burst of events
# is one redraw), and every 2 s in any case so that the ages move on.
WATCH_INTERVAL_SECONDS: Final = 2.0
WATCH_COALESCE_SECONDS: Final = 1.0
# The hidden first word that answers as kubectl_complete-cronlock does (cobra's name for it).
COMPLETE: Final = "__complete"
# Piped output has no terminal to fit; kubectl does not truncate it either.
_UNBOUNDED_WIDTH: Final = 10_000


def parser(prog: str = "cronlock") -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=prog,
        description="Inspect the Leases that keep cronlock-guarded CronJob runs from overlapping; "
        "check CronJob manifests before they ship.",
    )
    version = f"%(prog)s {contract.VERSION}"
    top.add_argument("--version", action="version", version=f"{prog} {contract.VERSION}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    status = commands.add_parser(
        "status",
        help="show who holds each guarded CronJob's lock",
        description=(
            "Show every guarded CronJob (annotated cronlock.io/enabled=true, or in a namespace "
            "labelled so) with its Lease and the rule that guards it (-o wide). Exit 0 when "
            "all is well, 1 when a Lease is expired but still held or a CronJob reached its "
            "cronlock.io/alert-after consecutive skips, 2 on usage errors, 69 when the API "
            "server is unreachable or refuses."
        ),
    )
    status.add_argument(
        "-n",
        "--namespace",
        help="namespace to show (default: the kubeconfig context's namespace, else default)",
    )
    status.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="show every namespace (wins over -n, as with kubectl)",
    )
    status.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="output format: table, wide, json or yaml (a List), name (cronjob.batch/NAME)",
    )
    status.add_argument(
        "-l", "--selector", default="", help="only CronJobs with these labels (kubectl's syntax)"
    )
    status.add_argument("--no-headers", action="store_true", help="tables without their header")
    status.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="list once, then watch: redraw when a CronJob or Lease changes (at most every "
        f"{WATCH_COALESCE_SECONDS:g}s) and every {WATCH_INTERVAL_SECONDS:g}s, until Ctrl-C",
    )
    status.add_argument(
        "--read-stores",
        action="store_true",
        help="also read the holders of locks kept in Redis or PostgreSQL (cronlock.io/store): "
        "reads each Secret the CronJobs name with your credentials and connects to the host "
        "its URL names (said on stderr first); without it those rows say in-store",
    )
    add_connection_flags(status)
    lint.add_parser(commands)
    freezing.add_parsers(commands, add_connection_flags)
    completion.add_parser(commands)
    for command in commands.choices.values():
        command.add_argument("--version", action="version", version=version)
    return top


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """kubectl's flags for reaching the API server, the same on every command that does."""
    parser.add_argument(
        "--request-timeout",
        default="30s",
        help="give up on a request after this long (a duration, like kubectl's; default 30s)",
    )
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: $KUBECONFIG, else the pod's ServiceAccount in a pod, "
        "else ~/.kube/config)",
    )
    parser.add_argument("--context", help="kubeconfig context to use")
    parser.add_argument("--cluster", help="kubeconfig cluster to use (instead of the context's)")
    parser.add_argument("--user", help="kubeconfig user to use (instead of the context's)")
    parser.add_argument(
        "-s", "--server", help="address and port of the API server (instead of the cluster's)"
    )
    parser.add_argument(
        "--token",
        help="bearer token for the API server (instead of the kubeconfig user's credentials)",
    )
    parser.add_argument(
        "--as",
        dest="impersonate",
        metavar="USER",
        help="act as this user or ServiceAccount (system:serviceaccount:NS:NAME)",
    )
    parser.add_argument(
        "--as-group",
        dest="impersonate_groups",
        action="append",
        default=[],
        metavar="GROUP",
        help="act as a member of this group too; repeat for more; needs --as",
    )
    parser.add_argument(
        "--insecure-skip-tls-verify",
        action="store_true",
        help="do not check the server's certificate (insecure: for test clusters only)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] == [COMPLETE]:
        return kubectl_complete(words[1:])
    prog = "kubectl cronlock" if Path(sys.argv[0]).name.startswith("kubectl-") else "cronlock"
    top = parser(prog)
    args = top.parse_args(words)
    if args.command is None:
        top.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command == "lint":
        return lint.run(args, prog)
    if args.command == "completion":
        return completion.run(top, args.shell)
    if args.command in ("freeze", "unfreeze"):
        return _freeze(args, prog)
    if args.read_stores and args.watch:
        print(f"{prog}: error: --read-stores: --watch never reads stores", file=sys.stderr)
        return EXIT_USAGE
    view = View(args.output, args.selector, args.no_headers, args.read_stores)
    cluster = _connection(args, prog)
    if isinstance(cluster, int):
        return cluster
    namespace = None if args.all_namespaces else (args.namespace or cluster.namespace)
    try:
        if args.watch:
            return _watch(cluster, namespace, view, prog)
        return _show_once(cluster, namespace, view, prog)
    except BrokenPipeError:
        # The reader went away (`| head`): nothing more to say, and no traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    finally:
        cluster.api.close()


def kubectl_complete(argv: Sequence[str] | None = None) -> int:
    """`kubectl_complete-cronlock WORD...` (or, hidden, `kubectl cronlock __complete WORD...`,
    which a krew install's completer runs): what `kubectl cronlock <TAB>` offers. kubectl
    (1.26 and later) runs `kubectl_complete-cronlock` from PATH with the words typed after
    `cronlock` and reads the answer in cobra's form; it connects to nothing."""
    words = sys.argv[1:] if argv is None else argv
    print(completion.cobra(parser("kubectl cronlock"), words), end="")
    return EXIT_OK


def _connect(prog: str, *how: Any) -> Cluster | int:
    """`connect(*how)`, or the exit code once the reason it cannot is printed."""
    try:
        return connect(*how)
    except UsageError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except NoConfiguration as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def _connection(args: argparse.Namespace, prog: str) -> Cluster | int:
    """The cluster the connection flags name, or the exit code once it is said why not."""
    try:
        timeout = parse_duration(args.request_timeout)
        if timeout <= 0:
            raise DurationError("must be more than 0s")
    except DurationError as error:
        print(
            f"{prog}: error: --request-timeout {args.request_timeout!r}: {error}", file=sys.stderr
        )
        return EXIT_USAGE
    overrides = Overrides(
        impersonate=args.impersonate or None,
        impersonate_groups=tuple(args.impersonate_groups),
        token=args.token or None,
        server=args.server or None,
        user=args.user or None,
        cluster=args.cluster or None,
        insecure_skip_tls_verify=args.insecure_skip_tls_verify,
    )
    return _connect(prog, args.kubeconfig, args.context, timeout, overrides)


def _freeze(args: argparse.Namespace, prog: str) -> int:
    cluster = _connection(args, prog)
    if isinstance(cluster, int):
        return cluster
    try:
        return freezing.run(args, cluster.api, args.namespace or cluster.namespace, prog)
    finally:
        cluster.api.close()


class View(NamedTuple):
    """How rows are chosen and shown."""

    output: Output
    selector: str = ""
    no_headers: bool = False
    read_stores: bool = False

    @property
    def structured(self) -> bool:
        return self.output in ("json", "yaml")


def _show_once(cluster: Cluster, namespace: str | None, view: View, prog: str) -> int:
    try:
        status_rows = _snapshot(cluster, namespace, view.selector, prog, view.read_stores)
    except APIError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if not status_rows and not view.structured:
        # Like kubectl's "No resources found": on stderr, so stdout stays parseable.
        print(_nothing_found(namespace), file=sys.stderr)
    else:
        print(_render(status_rows, namespace, view))
    for row in status_rows:
        for problem in row.problems:
            # A problem may quote a holder, which whoever held the lock chose.
            print(f"{prog}: warning: {printable(problem)}", file=sys.stderr)
    return exit_code(status_rows)


def _watch(cluster: Cluster, namespace: str | None, view: View, prog: str) -> int:
    """List once, then follow watch streams of the CronJobs and of cronlock's Leases (each
    in a thread of its own), redrawing from what they report."""
    changes: queue.Queue[Change] = queue.Queue()
    for source in (
        Collection(cluster, "cronjobs", namespace, view.selector),
        Collection(cluster, "leases", namespace, LEASE_SELECTOR),
    ):
        threading.Thread(
            target=follow,
            args=(source, changes.put, _pause),
            name=f"watch {source.kind}",
            daemon=True,
        ).start()

    def next_change(timeout: float) -> Change | None:
        try:
            return changes.get(timeout=timeout)
        except queue.Empty:
            return None

    screen = _Screen(namespace, view, prog, lambda: labelled_namespaces(cluster, namespace))
    try:
        _redraw(next_change, screen.draw)
    except KeyboardInterrupt:
        if view.output != "json":
            sys.stdout.write("\n")
    return EXIT_OK


def _redraw(
    next_change: Callable[[float], Change | None],
    draw: Callable[[Mirror], None],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Take changes in and draw, until interrupted: first once both lists are in (or one
    failed), then when something changed but at most once every WATCH_COALESCE_SECONDS
    (changes arriving meanwhile are drawn together), and every WATCH_INTERVAL_SECONDS."""
    mirror = Mirror()
    drawn_at: float | None = None
    changed = False
    while True:
        due: float | None = None
        if drawn_at is None:
            if mirror.ready or mirror.failure is not None:
                due = clock()
        elif changed:
            due = drawn_at + WATCH_COALESCE_SECONDS
        else:
            due = drawn_at + WATCH_INTERVAL_SECONDS
        # Waits are bounded so that Ctrl-C is never stuck behind an unbounded wait.
        wait = WATCH_INTERVAL_SECONDS if due is None else max(0.0, due - clock())
        change = next_change(wait)
        if change is not None:
            changed = mirror.apply(change) or changed
            continue
        if due is None or clock() < due:
            continue
        draw(mirror)
        drawn_at = clock()
        changed = False


class _Screen:
    """One redraw of --watch: a header and the table, or the API's failure in its place;
    with -o json one List a line, and failures on stderr."""

    def __init__(
        self,
        namespace: str | None,
        view: View,
        prog: str,
        labels: Callable[[], frozenset[str] | None] | None = None,
    ) -> None:
        self.namespace = namespace
        self.view = view
        self.prog = prog
        # Each CronJob's reading, kept between redraws (a version is read once).
        self.readings = Readings()
        # Which namespaces are labelled, read once, at the first draw that lists a CronJob
        # without the annotation (a label changed later shows in the next `--watch`).
        self.labels = labels
        json_lines = view.output == "json"
        self.clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() and not json_lines else ""

    def draw(self, mirror: Mirror) -> None:
        output = self.view.output
        if mirror.failure is not None:
            # A hiccup while watching is shown and retried, not the end of the watch;
            # JSON Lines on stdout stay parseable, so there it goes to stderr.
            if output == "json":
                print(f"{self.prog}: {mirror.failure}", file=sys.stderr, flush=True)
                return
            screen = f"{self.prog}: {mirror.failure}"
        else:
            cronjobs = mirror.cronjobs()
            if self.labels is not None and any(unannotated(item) for item in cronjobs):
                labels, self.labels = self.labels, None
                try:
                    labelled = _readable(labels(), self.prog)
                except APIError as error:
                    print(f"{self.prog}: {error}", file=sys.stderr, flush=True)
                    labelled = frozenset()
                self.readings = Readings(labelled=labelled)
            status_rows = rows(cronjobs, mirror.leases(), datetime.now(UTC), readings=self.readings)
            screen = _render(status_rows, self.namespace, self.view, compact=True)
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        header = "" if output == "json" else f"Every {WATCH_INTERVAL_SECONDS:g}s: {stamp}\n\n"
        sys.stdout.write(f"{self.clear}{header}{screen}\n")
        sys.stdout.flush()


def _readable(labelled: frozenset[str] | None, prog: str) -> frozenset[str]:
    """The namespaces that opt their CronJobs in by label; none, and one line on stderr
    saying so, when the credentials may not read namespaces (None)."""
    if labelled is None:
        print(
            f"{prog}: cannot read namespaces (forbidden): only CronJobs annotated "
            f"{contract.ANNOTATION_ENABLED}=true are shown, not those guarded by their "
            "namespace's label",
            file=sys.stderr,
        )
        return frozenset()
    return labelled


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _snapshot(
    cluster: Cluster,
    namespace: str | None,
    selector: str = "",
    prog: str = "cronlock",
    read: bool = False,
) -> list[StatusRow]:
    """The rows now; with `read` (--read-stores) a lock in Redis or PostgreSQL is read from
    its store where the credentials may read its Secret (status/stores.py), else noted on
    stderr. Without it such rows stay in-store and one line says how to read them."""
    cronjobs, leases, labelled = fetch(cluster, namespace, selector)
    readings = Readings(labelled=_readable(labelled, prog))
    status_rows = rows(cronjobs, leases, datetime.now(UTC), readings=readings)
    wanted = [StoredLock(*each) for each in stored_locks(status_rows)]
    if not wanted:
        return status_rows
    if not read:
        count = len(set(wanted))
        print(
            f"{prog}: {count} lock{'s' if count > 1 else ''} in Redis or PostgreSQL not read "
            "(in-store): add --read-stores to read them, with your credentials, from the "
            "hosts their Secrets name",
            file=sys.stderr,
        )
        return status_rows

    def say(line: str) -> None:
        # The host and the Secret are the CronJob author's strings.
        print(f"{prog}: {printable(line)}", file=sys.stderr, flush=True)

    reading = read_stores(cluster.api, wanted, say)
    for note in reading.notes:
        print(f"{prog}: {printable(note)}", file=sys.stderr)
    return rows(cronjobs, leases, datetime.now(UTC), stored=reading.documents, readings=readings)


def _render(
    status_rows: Sequence[StatusRow],
    namespace: str | None,
    view: View,
    *,
    compact: bool = False,
) -> str:
    if view.output == "json":
        if compact:
            return json.dumps(as_list(status_rows))
        return render_json(status_rows)
    if view.output == "yaml":
        return render_yaml(status_rows)
    if not status_rows:
        return _nothing_found(namespace)
    if view.output == "name":
        # A lock of N permits has a row per held permit: each CronJob named once.
        return "\n".join(dict.fromkeys(f"cronjob.batch/{row.cronjob}" for row in status_rows))
    width = shutil.get_terminal_size((_UNBOUNDED_WIDTH, 24)).columns
    table = render_table(
        status_rows, width, all_namespaces=namespace is None, wide=view.output == "wide"
    )
    return table.split("\n", 1)[1] if view.no_headers and "\n" in table else table


def _nothing_found(namespace: str | None) -> str:
    where = "any namespace" if namespace is None else f"namespace {namespace}"
    return (
        f"No guarded CronJobs (annotated {contract.ANNOTATION_ENABLED}=true, or in a namespace "
        f"labelled so) in {where}."
    )
