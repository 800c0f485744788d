"""Processes on this host: a holder's processes to signal, and the local control plane's
components to pause, resume and restart (the faults the reliability checkers inject, and
what the e2e tests and benchmarks use the same way).

Every fault undoes itself (SIGCONT, restart) in a `finally`, so a failing checker never
leaves the API server or etcd frozen for the tests that run after it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY_TIMEOUT = 60.0
COMPONENTS = ("kube-apiserver", "etcd")

# Starts a control plane component detached from us (its parent exits at once), so the
# component is never our zombie and `tests/controlplane/down` can stop it as usual.
_LAUNCHER = """
import json, subprocess, sys
spec = json.loads(sys.argv[1])
with open(spec["log"], "ab") as log:
    process = subprocess.Popen(spec["argv"], cwd=spec["cwd"], env=spec["env"], stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
print(process.pid)
"""


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return found
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def signal_all(pids: Iterable[int], signum: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue


def marked_processes(marker_name: str, marker_value: str) -> list[int]:
    """Processes whose environment carries our marker: every `run`, watchdog and CMD we made."""
    needle = f"{marker_name}={marker_value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(marker_name: str, marker_value: str) -> int:
    """SIGCONT then SIGKILL every marked process; bounded; returns how many were still there."""
    leftover = 0
    for _ in range(50):
        pids = [pid for pid in marked_processes(marker_name, marker_value) if alive(pid)]
        if not pids:
            return leftover
        leftover = max(leftover, len(pids))
        signal_all(pids, signal.SIGCONT)
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.1)
    raise RuntimeError(f"processes marked {marker_value} survive SIGKILL")


@dataclass
class ControlPlaneProcesses:
    """The local control plane's components, found through their pid files in `env_dir`."""

    env_dir: Path
    env: dict[str, str]

    def pid(self, component: str) -> int:
        return int((self.env_dir / f"{component}.pid").read_text())

    def pause(self, component: str) -> None:
        os.kill(self.pid(component), signal.SIGSTOP)

    def resume(self, component: str) -> None:
        try:
            os.kill(self.pid(component), signal.SIGCONT)
        except ProcessLookupError:
            return

    def restart(self, component: str, down_for: float = 0.0) -> None:
        """SIGKILL the component and start it again with the same argv, cwd, env and log,
        `down_for` seconds later."""
        pid = self.pid(component)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
        environ = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").split(b"\0")
        env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
        try:
            os.killpg(pid, signal.SIGCONT)
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            raise RuntimeError(f"{component} ({pid}) survived SIGKILL")
        time.sleep(down_for)
        spec = {
            "argv": [arg.decode() for arg in argv],
            "cwd": cwd,
            "env": env,
            "log": str(self.env_dir / "logs" / f"{component}.log"),
        }
        # etcd and the API server may need a moment to let go of their ports.
        for _ in range(20):
            launched = subprocess.run(
                [sys.executable, "-c", _LAUNCHER, json.dumps(spec)],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            )
            new_pid = int(launched.stdout.strip())
            (self.env_dir / f"{component}.pid").write_text(str(new_pid))
            time.sleep(0.5)
            if alive(new_pid):
                return
        raise RuntimeError(f"{component} does not start again; see its log in {self.env_dir}")

    def ready(self, server: str | None = None) -> bool:
        """Whether the API server (through the kubeconfig, or at `server`) answers /readyz."""
        at = [f"--server={server}"] if server else []
        result = subprocess.run(
            ["kubectl", *at, "get", "--raw", "/readyz", "--request-timeout=2s"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        return result.returncode == 0 and result.stdout.strip() == "ok"

    def wait_ready(self, timeout: float = READY_TIMEOUT, server: str | None = None) -> float:
        """Wait until the API server answers /readyz (etcd included); the monotonic time then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready(server):
                return time.monotonic()
            time.sleep(0.2)
        raise RuntimeError(f"the API server is not ready {timeout:g}s after a fault")

    def components(self) -> list[str]:
        """What tests/controlplane/up started here (its `components` file), else the two
        the classic control plane's faults signal."""
        try:
            return (self.env_dir / "components").read_text().split()
        except OSError:
            return list(COMPONENTS)

    def resume_all(self) -> None:
        for component in self.components():
            if (self.env_dir / f"{component}.pid").exists():
                self.resume(component)

    # --- an HA control plane (CRONLOCK_CONTROLPLANE_HA) ----------------------------------
    def ha_ports(self) -> dict[str, Any]:
        """ha.json: the etcd members' client ports, the links, the API servers, the balancer."""
        return dict(json.loads((self.env_dir / "ha.json").read_text()))

    def apiserver_url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.ha_ports()['apiservers'][name]}"

    def etcd_status(self, member: str) -> dict[str, Any]:
        """etcd's maintenance status of `member` (its JSON gateway): its id and its leader's."""
        port = self.ha_ports()["etcd"][member]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v3/maintenance/status", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=2) as answer:  # noqa: S310
            return dict(json.loads(answer.read()))

    def etcd_leader(self) -> str:
        """The member that is etcd's leader now, as the members that answer agree."""
        for member in self.ha_ports()["etcd"]:
            try:
                status = self.etcd_status(member)
            except OSError:
                continue
            if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                return str(member)
        raise RuntimeError("no etcd member says it leads")

    def wait_etcd_member(self, member: str, timeout: float = READY_TIMEOUT) -> float:
        """Wait until `member` answers and knows a leader; the monotonic time then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.etcd_status(member).get("leader"):
                    return time.monotonic()
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{member} has no leader {timeout:g}s after a fault")


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    """Exit code and stderr of a process (a sidecar's `run`, say) that ends by itself."""
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr
