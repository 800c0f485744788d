"""`cronlock lint`: the operator's verdict on manifests, as `file:line: severity: message`
lines and exit codes, from files, directories and standard input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cronlock_operator.cronjob.config import InvalidConfig, parse_config
from cronlock_operator.lint.checks import check
from cronlock_operator.lint.documents import Manifest, read_stream
from cronlock_operator.status import cli
from tests.support import gen
from tests.support.cronjobs import SETTINGS
from tests.unit.operator.test_config import BAD

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parent / "fixtures"
STREAM = FIXTURES / "bad" / "stream.yaml"
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
CRONLOCK = Path(sys.executable).parent / "cronlock"

# (line, severity, CronJob, start of the message) for bad/stream.yaml
STREAM_FINDINGS = [
    (
        18,
        "error",
        "typo",
        "cronlock.io/tll is not a cronlock annotation; did you mean cronlock.io/ttl?",
    ),
    (37, "error", "duration", 'cronlock.io/ttl: "5 minutes" is not a duration'),
    (57, "error", "renew", 'cronlock.io/renew: "60s" must be shorter than the ttl (60s)'),
    (75, "error", "policy", 'cronlock.io/policy: "fifo" is not a policy'),
    (95, "warning", "gap", "ttl 5m is longer than the shortest gap between two runs"),
    (114, "error", "root", 'cronlock.io/stop: "signal" cannot stop containers that run as root'),
    (134, "error", "unquoted", "cronlock.io/enabled: true is not a string; Kubernetes takes"),
    (
        152,
        "warning",
        "forgotten",
        'has cronlock.io/enable, cronlock.io/ttl but not cronlock.io/enabled: "true"',
    ),
]


def lint(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    code = cli.main(["lint", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def assert_findings(lines: list[str], path: str, expected: list[tuple[int, str, str, str]]) -> None:
    assert len(lines) == len(expected), "\n".join(lines)
    for line, (number, severity, cronjob, start) in zip(lines, expected, strict=True):
        assert line.startswith(f"{path}:{number}: {severity}: CronJob {cronjob}: {start}"), line


def write(path: Path, *documents: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


def line_of(path: Path | str, key: str) -> int:
    """The first line of the file that sets `key`."""
    rows = Path(path).read_text().splitlines()
    return next(number for number, row in enumerate(rows, 1) if row.lstrip().startswith(key))


def test_the_examples_are_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert EXAMPLES
    assert lint([str(path) for path in EXAMPLES], capsys) == (0, [], "")


def test_each_problem_is_reported_on_the_line_of_its_annotation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, lines, err = lint([str(STREAM)], capsys)
    assert code == 1
    assert err == ""
    assert_findings(lines, str(STREAM), STREAM_FINDINGS)


def test_the_items_of_a_list_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "bad" / "list.yaml"
    code, lines, _ = lint([str(path)], capsys)
    assert code == 1
    assert_findings(
        lines,
        str(path),
        [(28, "error", "reports/listed", 'cronlock.io/lock: "Reports_DB" is not a lock name')],
    )


def test_two_cronjobs_sharing_a_lock_without_consent_across_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, lines, _ = lint([str(FIXTURES / "shared")], capsys)
    assert code == 1
    # The other namespace's rebuild-index has a Lease of its own: no finding.
    assert lines == [
        f"{FIXTURES / 'shared' / 'rebuild.yml'}:8: error: CronJob shop/rebuild-index: lock "
        "orders-db is already used by CronJob import-orders; a CronJob may share a lock only "
        "when one that uses it names it: add cronlock.io/share-lock-with: rebuild-index to "
        "import-orders, or set cronlock.io/lock to a lock of its own"
    ]


@pytest.mark.parametrize("reverse", [False, True])
def test_consent_of_either_side_lets_them_share_in_any_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reverse: bool
) -> None:
    lock = {"cronlock.io/enabled": "true", "cronlock.io/lock": "db"}
    first = gen.cronjob("a", gen.with_annotations({**lock, "cronlock.io/share-lock-with": "b"}))
    second = gen.cronjob("b", gen.with_annotations(lock))
    documents = [second, first] if reverse else [first, second]
    assert lint([str(write(tmp_path / "jobs.yaml", *documents))], capsys) == (0, [], "")


@pytest.mark.parametrize("reverse", [False, True])
def test_cronjobs_sharing_a_lock_must_ask_the_same_permits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reverse: bool
) -> None:
    lock = {"cronlock.io/enabled": "true", "cronlock.io/lock": "db"}
    first = gen.cronjob(
        "a",
        gen.with_annotations(
            {**lock, "cronlock.io/share-lock-with": "b", "cronlock.io/permits": "2"}
        ),
    )
    agreeing = gen.cronjob("b", gen.with_annotations({**lock, "cronlock.io/permits": "2"}))
    documents = [agreeing, first] if reverse else [first, agreeing]
    assert lint([str(write(tmp_path / "jobs.yaml", *documents))], capsys) == (0, [], "")
    # Each consents to the other: the permits alone keep them apart.
    odd = gen.cronjob(
        "b",
        gen.with_annotations(
            {**lock, "cronlock.io/share-lock-with": "a", "cronlock.io/permits": "3"}
        ),
    )
    documents = [odd, first] if reverse else [first, odd]
    code, lines, _ = lint([str(write(tmp_path / "jobs.yaml", *documents))], capsys)
    assert code == 1
    [line] = lines
    # Either one may be the odd one out: whichever the cluster applies last is refused.
    assert re.search(
        r"error: CronJob team-a/[ab]: lock db has [23] permits, as CronJob [ab] asks", line
    ), line


def test_the_same_cronjob_in_two_files_is_one_user_of_its_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = gen.cronjob("report", gen.annotated({"cronlock.io/lock": "db"}))
    paths = [str(write(tmp_path / name, job)) for name in ("base.yaml", "overlay.yaml")]
    assert lint(paths, capsys) == (0, [], "")


def test_yaml_that_does_not_parse_is_exit_2_with_its_position(
    capsys: pytest.CaptureFixture[str],
) -> None:
    malformed = FIXTURES / "bad" / "malformed.yaml"
    code, lines, _ = lint([str(malformed), str(STREAM)], capsys)
    assert code == 2
    assert lines[0] == (
        f"{malformed}:7: error: not valid YAML: while parsing a block mapping expected "
        "<block end>, but found '<block mapping start>' (column 4)"
    )
    # The other files are still checked.
    assert_findings(lines[1:], str(STREAM), STREAM_FINDINGS)


def test_helm_template_output_on_standard_input() -> None:
    result = subprocess.run(
        [str(CRONLOCK), "lint", "-"],
        input=STREAM.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert_findings(result.stdout.splitlines(), "<stdin>", STREAM_FINDINGS)


def test_warnings_alone_pass_unless_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gap = gen.cronjob(
        "report", gen.with_schedule("*/2 * * * *"), gen.annotated({"cronlock.io/ttl": "5m"})
    )
    path = str(write(tmp_path / "gap.yaml", gap))
    code, lines, _ = lint([path], capsys)
    assert (code, len(lines)) == (0, 1)
    ttl = line_of(path, "cronlock.io/ttl:")
    assert lines[0].startswith(f"{path}:{ttl}: warning: CronJob team-a/report: ttl 5m is longer")
    code, strict_lines, _ = lint(["--strict", path], capsys)
    assert (code, strict_lines) == (1, lines)


def test_a_labelled_namespace_in_the_files_guards_its_cronjobs_and_guards_says_which_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Namespace labelled cronlock.io/enabled=true among the files (or named by
    --labelled-namespace) guards its CronJobs without the annotation: checked as the
    operator checks them (here a bad ttl), and --guards says which rule guards each."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team-a", "labels": {"cronlock.io/enabled": "true"}},
    }
    bad = gen.cronjob(
        "bad", gen.with_annotations({"cronlock.io/ttl": "soon"}), gen.service_account("reports")
    )
    out = gen.cronjob("out", gen.with_annotations({"cronlock.io/enabled": "false"}))
    other = gen.cronjob(
        "other",
        gen.in_namespace("team-b"),
        gen.with_annotations({"cronlock.io/ttl": "9m"}),
        gen.service_account("reports"),
    )
    path = str(write(tmp_path / "team.yaml", namespace, bad, out, other))

    code, lines, _ = lint([path], capsys)
    assert code == 1
    assert_findings(
        lines,
        path,
        [
            (line_of(path, "cronlock.io/ttl: soon"), "error", "team-a/bad", "cronlock.io/ttl"),
            (
                line_of(path, "cronlock.io/ttl: 9m"),
                "warning",
                "team-b/other",
                "has cronlock.io/ttl",
            ),
        ],
    )
    code, lines, _ = lint(["--guards", "--labelled-namespace", "team-b", path], capsys)
    assert code == 1
    info = [line.split(": info: ", 1)[1] for line in lines if ": info: " in line]
    assert info == [
        "CronJob team-a/bad: guarded by its namespace's label cronlock.io/enabled=true",
        'CronJob team-a/out: not guarded: annotated cronlock.io/enabled: "false"',
        "CronJob team-b/other: guarded by its namespace's label cronlock.io/enabled=true",
    ]
    # Info lines are not problems, not even under --strict.
    fine = str(write(tmp_path / "fine.yaml", gen.cronjob("report")))
    code, lines, _ = lint(["--guards", "--strict", fine], capsys)
    assert code == 0
    assert lines[0].endswith("CronJob team-a/report: guarded by its annotation cronlock.io/enabled")


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["lint", "-o", "json", str(STREAM)])
    findings = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(f["line"], f["severity"]) for f in findings] == [
        (line, severity) for line, severity, _, _ in STREAM_FINDINGS
    ]
    assert findings[0] == {
        "path": str(STREAM),
        "line": 18,
        "severity": "error",
        "message": findings[0]["message"],
    }


def test_directories_are_read_recursively_and_chart_templates_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = gen.cronjob("report", gen.annotated({"cronlock.io/ttl": "1 hour"}))
    (tmp_path / "apps" / "nightly").mkdir(parents=True)
    found = write(tmp_path / "apps" / "nightly" / "job.yml", bad)
    write(tmp_path / "apps" / "notes.txt", bad)
    chart = tmp_path / "charts" / "jobs"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: jobs\nversion: 0.1.0\n")
    (chart / "templates" / "cronjob.yaml").write_text("{{- if .Values.enabled }}\nkind: CronJob\n")
    code, lines, _ = lint([str(tmp_path)], capsys)
    assert code == 1
    assert len(lines) == 1
    ttl = line_of(found, "cronlock.io/ttl:")
    assert lines[0].startswith(f"{found}:{ttl}: error: CronJob team-a/report: cronlock.io/ttl:")


def test_a_missing_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = lint([str(tmp_path / "nope.yaml"), str(EXAMPLES[0])], capsys)
    assert (code, lines) == (2, [])
    assert err == f"cronlock lint: error: {tmp_path / 'nope.yaml'}: No such file or directory\n"


def test_no_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["lint"])
    assert exit_.value.code == 2
    assert "FILE|DIR|-" in capsys.readouterr().err


def test_a_bad_default_ttl_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = lint(["--default-ttl", "2s", str(STREAM)], capsys)
    assert code == 2
    assert "--default-ttl '2s'" in err


GOOD = [
    {},
    {"cronlock.io/ttl": "5m", "cronlock.io/policy": "wait", "cronlock.io/wait-timeout": "1m"},
    {"cronlock.io/lock": "shared.db", "cronlock.io/share-lock-with": "a, b"},
    {"cronlock.io/stop": "signal", "cronlock.io/alert-after": "3"},
    {"cronlock.io/policy": "wait", "cronlock.io/max-hold": "6h"},
    {"cronlock.io/permits": "16"},
]


@pytest.mark.parametrize(
    ("annotations", "cronjob"),
    [(case[0], case[1]) for case in BAD] + [(good, ()) for good in GOOD],
)
def test_lint_refuses_exactly_what_the_operator_refuses(
    tmp_path: Path, annotations: dict[str, str], cronjob: tuple[gen.Modifier, ...]
) -> None:
    """The operator's own parse decides; lint reports its error, on that annotation's line."""
    body = gen.cronjob(
        "report", gen.with_schedule("0 * * * *"), gen.annotated(annotations), *cronjob
    )
    path = write(tmp_path / "job.yaml", body)
    manifests = [
        item for item in read_stream("job.yaml", path.read_text()) if isinstance(item, Manifest)
    ]
    findings = check(manifests, SETTINGS)
    refused = refusal(body)
    if refused is None:
        assert findings == []
        return
    assert [(f.severity, f.message) for f in findings] == [
        ("error", f"CronJob team-a/report: {refused}")
    ]
    assert findings[0].line == line_of(path, f"{refused.annotation}:")


def refusal(cronjob: dict[str, Any]) -> InvalidConfig | None:
    """What the operator's own parse says of the CronJob's annotations."""
    try:
        parse_config(cronjob, SETTINGS)
    except InvalidConfig as error:
        return error
    return None


def test_the_pre_commit_hook_runs_the_installed_command_on_yaml_files() -> None:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(hook for hook in hooks if hook["id"] == "cronlock-lint")
    assert hook["language"] == "python"
    assert hook["entry"] == "cronlock lint"
    assert "cronlock = " in (ROOT / "pyproject.toml").read_text()
    assert "      - id: cronlock-lint\n" in (ROOT / "docs" / "USAGE.md").read_text()
    pattern = re.compile(hook["files"])
    assert [bool(pattern.search(name)) for name in ("a.yaml", "b/c.yml", "d.json")] == [
        True,
        True,
        False,
    ]


def test_a_labelled_namespace_says_which_cronjobs_its_label_alone_does_not_guard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Security review N4: the label alone guards no CronJob on `default` and imposes no
    `stop: signal`; lint warns as the operator's NotGuarded Warning does (not an error:
    the CronJob runs as written), and --guards says why."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team-a", "labels": {"cronlock.io/enabled": "true"}},
    }
    backup = gen.cronjob("backup", gen.not_opted_in())
    own = gen.cronjob("own", gen.not_opted_in(), gen.service_account("backups"))
    path = str(write(tmp_path / "team.yaml", namespace, backup, own))

    code, lines, _ = lint(["--guards", path], capsys)
    assert code == 0
    warnings = [line.split(": warning: ", 1)[1] for line in lines if ": warning: " in line]
    assert len(warnings) == 1
    assert warnings[0].startswith("CronJob team-a/backup: not guarded although its namespace")
    assert "ServiceAccount of its own" in warnings[0]
    info = [line.split(": info: ", 1)[1] for line in lines if ": info: " in line]
    assert info == [
        "CronJob team-a/backup: not guarded: its namespace's label cronlock.io/enabled=true "
        "alone does not guard a CronJob on the account 'default' nor impose stop: signal",
        "CronJob team-a/own: guarded by its namespace's label cronlock.io/enabled=true",
    ]
    code, _, _ = lint(["--strict", path], capsys)
    assert code == 1, "--strict fails on the warning"
