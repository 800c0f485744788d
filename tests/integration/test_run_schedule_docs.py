"""docs/USAGE.md, "Outside Kubernetes": the VM's crontab line and the CronJob it shares
ticks with, run as cron runs the line (bash, the crontab's variables) on a real Redis."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from cronlock_sidecar.lock import schedule, ticks
from tests.support.papers import marked_block
from tests.support.paths import ROOT, SIDECAR
from tests.support.stores import RedisServer

USAGE_MD = ROOT / "docs" / "USAGE.md"
WORK = "/opt/reports/nightly.sh"
URL_FILE = "/etc/cronlock/store-url"


def crontab() -> tuple[dict[str, str], list[str], list[str]]:
    """The crontab block: its variables, the job's five fields, and its command's words."""
    variables: dict[str, str] = {}
    jobs = []
    for line in marked_block(USAGE_MD, "vm-crontab").splitlines():
        name, equals, value = line.partition("=")
        if equals and " " not in name:
            variables[name] = value
        else:
            jobs.append(line)
    assert len(jobs) == 1, jobs
    words = jobs[0].split(None, 5)
    return variables, words[:5], shlex.split(words[5])


def flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_the_crontab_line_names_the_cronjobs_ticks_and_lock() -> None:
    variables, fields, command = crontab()
    cronjob = yaml.safe_load(marked_block(USAGE_MD, "vm-cronjob"))
    metadata, spec = cronjob["metadata"], cronjob["spec"]
    assert command[:2] == ["cronlock-sidecar", "run"]
    # cron's fields start the run; --schedule names its tick: the same schedule, the
    # CronJob's, in the CronJob's zone.
    assert flag(command, "--schedule") == " ".join(fields) == spec["schedule"]
    assert flag(command, "--time-zone") == spec["timeZone"]
    assert flag(command, "--tick-of") == metadata["name"]
    assert flag(command, "--lease") == f"{metadata['namespace']}/cronlock-{metadata['name']}"
    assert metadata["annotations"]["cronlock.io/store"] == "redis"
    assert variables == {"CRONLOCK_STORE_FILE": URL_FILE}
    assert command[-2:] == ["--", WORK]


def cron_runs(
    line: str, variables: dict[str, str], url_file: Path, work: Path
) -> subprocess.Popen[str]:
    """The crontab's command as cron runs it: `sh -c LINE` with the crontab's variables, the
    store's URL file and the work in the documented paths' places."""
    line = line.replace(URL_FILE, str(url_file)).replace(WORK, str(work))
    env = {
        "PATH": f"{SIDECAR.parent}:/usr/bin:/bin",
        "HOME": str(work.parent),
        **{name: value.replace(URL_FILE, str(url_file)) for name, value in variables.items()},
    }
    return subprocess.Popen(
        ["sh", "-c", line], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def setup(tmp_path: Path, server: RedisServer, name: str) -> tuple[Path, Path]:
    url_file = tmp_path / "store-url"
    url_file.write_text(server.url + "\n")
    work = tmp_path / name
    told = tmp_path / f"{name}.told"
    work.write_text(
        "#!/bin/sh\n"
        f'echo "$CRONLOCK_TICK|$CRONLOCK_PREVIOUS_TICK|$CRONLOCK_MANUAL" > {told}\n'
        "sleep 1\n"
    )
    work.chmod(0o755)
    return url_file, work


def test_the_crontab_line_as_written_runs_only_at_its_tick(
    tmp_path: Path, redis_store: RedisServer
) -> None:
    variables, _, command = crontab()
    line = marked_block(USAGE_MD, "vm-crontab").splitlines()[-1].split(None, 5)[5]
    url_file, work = setup(tmp_path, redis_store, "nightly.sh")
    started = datetime.now(UTC)
    run = cron_runs(line, variables, url_file, work)
    _, err = run.communicate(timeout=60)
    tick = schedule.latest_tick(
        flag(command, "--schedule"), flag(command, "--time-zone"), started, 60
    )
    if tick is None:
        # Started by hand away from 03:00 Berlin: refused, not named an old tick.
        assert run.returncode == 78, err
        assert "--schedule: no time of '0 3 * * *' (Europe/Berlin) within --tick-window" in err
        assert not (tmp_path / "nightly.sh.told").exists()
    else:
        assert run.returncode == 0, err
        told = (tmp_path / "nightly.sh.told").read_text()
        assert told.startswith(ticks.format_tick(tick) + "|"), told


def test_two_vms_crons_name_the_same_tick_on_one_lock(
    tmp_path: Path, redis_store: RedisServer
) -> None:
    variables, _, _ = crontab()
    line = marked_block(USAGE_MD, "vm-crontab").splitlines()[-1].split(None, 5)[5]
    # A minutely schedule, so that now is a tick of it; both VMs start within one minute,
    # as two crons fire a few seconds apart, the second after the first's work has ended.
    line = line.replace("'0 3 * * *'", "'* * * * *'").replace(
        "--lease reports/", f"--lease reports-{os.getpid()}/"
    )
    while datetime.now(UTC).second > 40:
        time.sleep(1)
    url_file, work_a = setup(tmp_path, redis_store, "vm-a.sh")
    _, work_b = setup(tmp_path, redis_store, "vm-b.sh")
    started = datetime.now(UTC)
    first = cron_runs(line, variables, url_file, work_a)
    _, err_a = first.communicate(timeout=60)
    second = cron_runs(line, variables, url_file, work_b)
    _, err_b = second.communicate(timeout=60)
    tick = ticks.format_tick(started.replace(second=0, microsecond=0))
    assert first.returncode == 0, err_a
    assert (tmp_path / "vm-a.sh.told").read_text() == f"{tick}||false\n"
    assert f"run works tick {tick} of nightly" in err_a
    # The second VM names the same tick, claimed by the first: it skips `already ran`.
    assert second.returncode == 75, err_b
    assert f"already ran: tick {tick} of nightly" in err_b
    assert not (tmp_path / "vm-b.sh.told").exists()
