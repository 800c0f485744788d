"""Small helpers for driving a real cluster: polling, finished pods, running kubectl and helm."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, every: float = 0.25) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def holds(probe: Callable[[], object], seconds: float, what: str, every: float = 0.25) -> None:
    """Check `probe` over `seconds` and fail at its first falsy answer (a probe may also
    assert): that nothing happened is shown over a window that can fail, never by a bare
    sleep. It is checked at once, every `every` seconds, and once more at the end."""
    start = time.monotonic()
    deadline = start + seconds
    while True:
        now = time.monotonic()
        if not probe():
            raise AssertionError(f"{what}: no longer true after {now - start:.1f}s")
        if now >= deadline:
            return
        time.sleep(min(every, max(0.0, deadline - now)))


def terminated(name: str, exit_code: int) -> dict[str, Any]:
    return {
        "name": name,
        "ready": False,
        "restartCount": 0,
        "image": "busybox:1.37",
        "imageID": "",
        "state": {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": "2026-01-01T00:00:00Z",
                "finishedAt": "2026-01-01T00:00:01Z",
            }
        },
    }


def finish_pod(
    core: Any,
    namespace: str,
    pod: str,
    *,
    gate_exit: int,
    main_exit: int = 0,
    gate_message: str | None = None,
) -> None:
    """Write a terminal pod status through the status subresource, as a kubelet would.

    A gate that exited non-zero means the user containers never started; `gate_message` is
    its termination message (what it wrote to /dev/termination-log).
    """
    ran = gate_exit == 0
    gate = terminated("cronlock-gate", gate_exit)
    if gate_message is not None:
        gate["state"]["terminated"]["message"] = gate_message
    status: dict[str, Any] = {
        "phase": "Succeeded" if ran and main_exit == 0 else "Failed",
        "initContainerStatuses": [terminated("cronlock", 0), gate],
        "containerStatuses": [terminated("main", main_exit)] if ran else [],
    }
    core.patch_namespaced_pod_status(
        pod, namespace, {"status": status}, _content_type="application/merge-patch+json"
    )


def run_tool(
    env: dict[str, str],
    *argv: str,
    input_text: str | None = None,
    check: bool = True,
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run kubectl, helm or another CLI with `env`; with `check`, fail naming its stderr."""
    result = subprocess.run(
        list(argv),
        env=env,
        input=input_text,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result
