"""`cronlock-sidecar run --max-hold` with the lock in Redis and in PostgreSQL, on real
servers: the bound is the sidecar's own, so a store needs nothing of its own for it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.paths import SIDECAR
from tests.support.stores import PostgresServer, RedisServer

BOUND = 2.0
# The grace leaves a contender started just past the bound time to start up and decide
# while the stopped command still holds the lock (at 1 s, one started 0.5 s into the grace
# decided after the release on a loaded fresh machine).
GRACE = 3.0


def run(url: str, lock: str, script: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CRONLOCK_STORE": url}
    env.pop("KUBECONFIG", None)
    return subprocess.Popen(
        [str(SIDECAR), "run", "--lease", lock, "--ttl", "20s", "--renew", "500ms", *extra,
         "--", "sh", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_command_past_its_max_hold_is_stopped_keeps_the_lock_until_gone_then_frees_it(
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    cleanup: list[subprocess.Popen[str]],
) -> None:
    server: RedisServer | PostgresServer = request.getfixturevalue(f"{kind}_store")
    lock = f"tests/max-hold-{kind}-{os.getpid()}"
    started = tmp_path / "started"
    # Ignores SIGTERM (and so does its child): only the SIGKILL after the grace ends it.
    hung = run(
        server.url,
        lock,
        f"trap '' TERM; touch {started}; sleep 60 & wait; sleep 60",
        "--max-hold", f"{BOUND:g}s", "--kill-grace", f"{GRACE:g}s",
    )  # fmt: skip
    cleanup.append(hung)
    deadline = time.monotonic() + 20
    while not started.exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    began = time.monotonic()
    # Past the bound, within the grace: the lock is still the stopped command's.
    time.sleep(BOUND + 0.3 - (time.monotonic() - began))
    during = run(server.url, lock, "echo RAN DURING")
    cleanup.append(during)
    out, err = during.communicate(timeout=30)
    assert during.returncode == 75, err
    assert "RAN DURING" not in out

    _, err = hung.communicate(timeout=30)
    took = time.monotonic() - began
    assert hung.returncode == 76, err
    assert took + 0.2 >= BOUND + GRACE, f"ended {took:.1f}s after its start: before the SIGKILL"
    assert took < BOUND + GRACE + 3.0, err
    assert "max-hold exceeded: held 2" in err

    after = run(server.url, lock, "echo RAN AFTER")
    out, err = after.communicate(timeout=30)
    assert after.returncode == 0, err
    assert "RAN AFTER" in out
