"""`cronlock lint` on the command line: paths, output, exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from cronlock_operator.cronjob.defaults import LockDefaults
from cronlock_operator.lint.checks import Finding, check
from cronlock_operator.lint.documents import SUFFIXES, BadYAML, Manifest, read_stream
from cronlock_operator.settings import OperatorSettings
from cronlock_sidecar import contract
from cronlock_sidecar.lock.durations import DurationError, parse_duration

EXIT_CLEAN: Final = 0
EXIT_PROBLEMS: Final = 1
EXIT_USAGE: Final = 2  # also: a file that cannot be read, YAML that does not parse
STDIN: Final = "-"
STDIN_SHOWN: Final = "<stdin>"
# Never injected by lint; OperatorSettings only needs one.
_IMAGE: Final = "cronlock-sidecar"


def add_parser(commands: Any) -> None:
    """The `lint` subcommand of `cronlock` (`commands`: the subparsers to add it to)."""
    lint = commands.add_parser(
        "lint",
        help="check CronJob manifests with the operator's own rules, without a cluster",
        description=(
            "Check every CronJob annotated cronlock.io/enabled=true, or in a namespace labelled "
            "so (a Namespace object in the files, or --labelled-namespace), in the files, "
            "directories "
            "(*.yaml, *.yml; Helm chart templates are skipped: lint `helm template` output) "
            "or standard input (-) with the operator's own rules, and CronJobs of one "
            "namespace sharing a lock for the consent it needs. Prints FILE:LINE: SEVERITY: "
            "MESSAGE. Exit 0 when clean (warnings alone too, unless --strict), 1 when there "
            "are problems, 2 on usage errors, unreadable files or YAML that does not parse."
        ),
    )
    lint.add_argument(
        "paths", nargs="+", metavar="FILE|DIR|-", help="manifests; - reads standard input"
    )
    lint.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    lint.add_argument(
        "--labelled-namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="a namespace labelled cronlock.io/enabled=true in the cluster (repeatable); "
        "Namespace objects so labelled in the files count too",
    )
    lint.add_argument(
        "--guards",
        action="store_true",
        help="also print, for each CronJob, the rule that guards it (its annotation or its "
        "namespace's label) or why it is not guarded, as info lines",
    )
    lint.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="text or json"
    )
    lint.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="the namespace of objects that name none, as with kubectl apply -n (default: default)",
    )
    defaults = LockDefaults()
    lint.add_argument(
        "--default-ttl",
        default=f"{defaults.default_ttl_seconds}s",
        help="the operator's --default-ttl (the chart's defaults.ttl) for CronJobs without "
        f"cronlock.io/ttl (default {defaults.default_ttl_seconds}s)",
    )
    lint.add_argument(
        "--default-policy",
        default=defaults.default_policy,
        choices=list(contract.DEFAULT_POLICIES),
        help="the operator's --default-policy (the chart's defaults.policy; default "
        f"{defaults.default_policy})",
    )


def run(args: argparse.Namespace, prog: str) -> int:
    try:
        ttl = parse_duration(args.default_ttl)
        if not ttl.is_integer():
            raise DurationError("must be whole seconds")
        settings = OperatorSettings(
            sidecar_image=_IMAGE,
            sidecar_stores_image=_IMAGE,
            lock=LockDefaults(default_ttl_seconds=int(ttl), default_policy=args.default_policy),
        )
    except (DurationError, ValueError) as error:
        print(f"{prog} lint: error: --default-ttl {args.default_ttl!r}: {error}", file=sys.stderr)
        return EXIT_USAGE
    failed = False
    shown_paths: list[str] = []  # the order findings are printed in
    manifests: list[Manifest] = []
    findings: list[Finding] = []
    for path in args.paths:
        try:
            for shown, text in _read(path):
                shown_paths.append(shown)
                for item in read_stream(shown, text):
                    if isinstance(item, BadYAML):
                        findings.append(Finding(item.path, item.line, "error", item.message))
                        failed = True
                    else:
                        manifests.append(item)
        except (OSError, UnicodeDecodeError) as error:
            print(f"{prog} lint: error: {path}: {_reason(error)}", file=sys.stderr)
            failed = True
    findings.extend(
        check(manifests, settings, args.namespace, args.labelled_namespace, guards=args.guards)
    )
    order = {shown: index for index, shown in reversed(list(enumerate(shown_paths)))}
    findings.sort(key=lambda f: (order[f.path], f.line))
    if args.output == "json":
        print(json.dumps([vars(finding) for finding in findings], indent=2))
    else:
        for finding in findings:
            print(finding)
    if failed:
        return EXIT_USAGE
    if any(f.severity == "error" or (args.strict and f.severity == "warning") for f in findings):
        return EXIT_PROBLEMS
    return EXIT_CLEAN


def _read(path: str) -> Iterator[tuple[str, str]]:
    """(shown path, text) of each file `path` names."""
    if path == STDIN:
        yield STDIN_SHOWN, sys.stdin.buffer.read().decode("utf-8")
        return
    root = Path(path)
    if root.is_dir():
        files = sorted(
            file for file in root.rglob("*") if file.suffix in SUFFIXES and file.is_file()
        )
        for file in files:
            if not is_chart_template(file):
                yield str(file), file.read_bytes().decode("utf-8")
        return
    if not is_chart_template(root):
        yield path, root.read_bytes().decode("utf-8")


def is_chart_template(path: Path) -> bool:
    """A file of a Helm chart's templates/ (Go templates, not YAML until rendered)."""
    return any(
        parent.name == "templates" and (parent.parent / "Chart.yaml").is_file()
        for parent in path.parents
    )


def _reason(error: OSError | UnicodeDecodeError) -> str:
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte {error.start})"
    return error.strerror or str(error)
