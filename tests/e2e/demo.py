"""`make demo`: a local cluster with a real node, the operator, and two runs that would overlap."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import kubernetes

from tests.support.controlplane import ControlPlane, make_service_account_kubeconfig
from tests.support.kube import wait_for
from tests.support.node import BUSYBOX_IMAGE
from tests.support.operator import OPERATOR_NAMESPACE, SIDECAR_IMAGE, install_chart_rbac

ROOT = Path(__file__).resolve().parent.parent.parent
ENV_DIR = ROOT / ".testenv" / "demo"
EXAMPLE = ROOT / "manifests" / "examples" / "basic.yaml"
NAMESPACE = "cronlock-demo"
VENV_BIN = ROOT / ".venv" / "bin"


class Style:
    """ANSI colour when stdout is a terminal (and NO_COLOR is unset), plain text otherwise."""

    def __init__(self) -> None:
        self.on = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        self.started = time.monotonic()

    def _paint(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text

    def step(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        print(
            f"\n{self._paint('1;34', '==>')} {self._paint('1', text)} [{elapsed:.0f}s]", flush=True
        )

    def command(self, text: str) -> None:
        print(self._paint("2", f"$ {text}"), flush=True)

    def output(self, text: str) -> None:
        for line in text.rstrip("\n").splitlines():
            print(f"  {line}", flush=True)

    def highlight(self, text: str) -> None:
        print(f"  {self._paint('1;33', text)}", flush=True)

    def good(self, text: str) -> None:
        print(f"  {self._paint('32', text)}", flush=True)

    def bad(self, text: str) -> None:
        print(self._paint("1;31", text), file=sys.stderr, flush=True)


class Demo:
    """Everything the demo starts, so that it can stop exactly that."""

    def __init__(self, style: Style) -> None:
        self.style = style
        self.env: dict[str, str] = dict(os.environ, CRONLOCK_TESTENV_DIR=str(ENV_DIR))
        self.api: kubernetes.client.ApiClient | None = None
        self.logs_seen: list[tuple[str, dict[str, str]]] = []

    # -- setting up --

    def start_controlplane(self) -> None:
        self.style.step("Starting the local control plane (etcd, kube-apiserver, controllers)")
        result = subprocess.run(
            [str(ROOT / "tests" / "controlplane" / "up")],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise DemoError(f"tests/controlplane/up failed:\n{result.stderr}{result.stdout}")
        for line in result.stdout.splitlines():
            match = re.fullmatch(r"export (\w+)=(.*)", line)
            if match:
                self.env[match.group(1)] = os.path.expandvars(match.group(2).strip("'"))
        self.env["PATH"] = f"{VENV_BIN}:{self.env['PATH']}"
        self.api = kubernetes.config.new_client_from_config(config_file=self.env["KUBECONFIG"])
        self.style.good(f"API server {self._plane().server()}")

    def start_operator(self) -> None:
        self.style.step("Starting cronlock-operator under the Helm chart's RBAC")
        api = self._api()
        account = install_chart_rbac(api, self.env)
        kubeconfig = make_service_account_kubeconfig(
            self._plane(), api, OPERATOR_NAMESPACE, account, ENV_DIR
        )
        log = ENV_DIR / "operator.log"
        self._spawn(
            "operator",
            [
                str(VENV_BIN / "cronlock-operator"),
                "--metrics-port",
                "0",
                "--liveness",
                "",
                "--sidecar-image",
                SIDECAR_IMAGE,
                "--sidecar-image-pull-policy",
                "Never",
            ],
            dict(self.env, KUBECONFIG=str(kubeconfig)),
            log,
        )
        self._wait_for_line(log, "cronlock operator started", "the operator")
        self.style.good(f"running as ServiceAccount {OPERATOR_NAMESPACE}/{account}; log {log}")

    def start_node(self) -> None:
        self.style.step(
            "Starting a real node: kubelet, containerd and runc (images from our Dockerfile)"
        )
        result = subprocess.run(
            [str(ROOT / "tests" / "controlplane" / "node"), "up"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise DemoError(f"tests/controlplane/node up failed:\n{result.stderr}{result.stdout}")
        self.kubectl("get", "nodes", "-o", "wide")

    # -- the story --

    def apply_example(self) -> None:
        self.style.step("Applying manifests/examples/basic.yaml (a 90s report every minute)")
        self.kubectl("create", "namespace", NAMESPACE)
        # The node has no registry: the example's busybox:1.37 becomes the busybox image
        # the node was given (Debian's busybox-static), never pulled.
        manifest = EXAMPLE.read_text().replace(
            "image: busybox:1.37", f"image: {BUSYBOX_IMAGE}\n              imagePullPolicy: Never"
        )
        example = EXAMPLE.relative_to(ROOT)
        self.style.command(f"sed 's#busybox:1.37#{BUSYBOX_IMAGE}#' {example} | kubectl apply -f -")
        self.kubectl_quiet("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest)
        batch = kubernetes.client.BatchV1Api(self._api())

        def injected() -> bool:
            cronjob = batch.read_namespaced_cron_job("report", NAMESPACE)
            init = cronjob.spec.job_template.spec.template.spec.init_containers or []
            return [c.name for c in init][:2] == ["cronlock", "cronlock-gate"]

        wait_for(injected, 30, "the operator to inject the CronJob")
        self.style.good("the operator injected the cronlock sidecar and gate")

    def overlap(self) -> tuple[str, str]:
        """Start a run, then a second while the first works; return (holder, skipped job)."""
        self.style.step("Starting a run by hand, as `kubectl create job --from` does")
        self.kubectl("create", "job", "report-manual-1", "--from=cronjob/report", "-n", NAMESPACE)
        holder = wait_for(self._holder, 90, "a run to take the Lease")
        self.style.good(f"Lease cronlock-report is held by {holder}")

        self.style.step("Starting a second run while the first one works")
        self.kubectl("create", "job", "report-manual-2", "--from=cronjob/report", "-n", NAMESPACE)
        skipped = wait_for(self._skipped_with_logs, 90, "the second run to be skipped")
        return holder, skipped[0]

    def tick(self, seen: str) -> str:
        """Wait for the CronJob's own schedule: its run finds the lock held too."""
        wait = 60 - time.time() % 60
        self.style.step(f"Waiting for the schedule (* * * * *): next tick in about {wait:.0f}s")
        skipped = wait_for(
            lambda: [job for job in self._skipped_with_logs() if job != seen],
            100,
            "a scheduled skip",
        )[0]
        self.style.good(f"the scheduled run {skipped} was skipped as well")
        return skipped

    def report(self, skipped: list[str]) -> None:
        self.style.step(f"What the skipped runs' sidecars logged ({', '.join(skipped)})")
        for job in skipped:
            for pod in self._pods_of(job):
                log = self._logs(pod, "cronlock")
                for line in log.splitlines():
                    if "already running" in line:
                        self.style.highlight(f"[{pod} cronlock] {line}")
                gate = self._logs(pod, "cronlock-gate").strip()
                self.style.output(f"[{pod} cronlock-gate] {gate}")

        self.style.step("The CronJob's Events")
        self.kubectl(
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            "involvedObject.kind=CronJob,involvedObject.name=report",
            "--sort-by=.metadata.creationTimestamp",
        )
        self.style.step("CronJob, Jobs and the Lease")
        self.kubectl("get", "cronjob,jobs,leases", "-n", NAMESPACE)

    # -- stopping --

    def stop(self) -> None:
        stop_everything(self.env)

    # -- helpers --

    def kubectl(self, *args: str) -> str:
        self.style.command("kubectl " + " ".join(args))
        result = subprocess.run(
            ["kubectl", *args], env=self.env, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        self.style.output(result.stdout)
        return result.stdout

    def kubectl_quiet(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            ["kubectl", *args],
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        self.style.output(result.stdout)
        return result.stdout

    def _holder(self) -> str | None:
        leases = kubernetes.client.CoordinationV1Api(self._api())
        try:
            lease = leases.read_namespaced_lease("cronlock-report", NAMESPACE)
        except kubernetes.client.ApiException:
            return None
        return lease.spec.holder_identity or None

    def _skipped_with_logs(self) -> list[str]:
        self.keep_skip_logs()
        return self._skipped_jobs()

    def _skipped_jobs(self) -> list[str]:
        events = kubernetes.client.CoreV1Api(self._api()).list_namespaced_event(
            NAMESPACE, field_selector="involvedObject.name=report"
        )
        found = []
        for event in sorted(events.items, key=lambda e: e.metadata.creation_timestamp):
            match = re.match(r"run (\S+) skipped", event.message or "")
            if event.reason == "Skipped" and match:
                found.append(match.group(1))
        return found

    def _pods_of(self, job: str) -> list[str]:
        return [pod for pod, _ in self.logs_seen if pod.startswith(f"{job}-")]

    def _logs(self, pod: str, container: str) -> str:
        return dict(self.logs_seen).get(pod, {}).get(container, "")

    def keep_skip_logs(self) -> None:
        """Read the skipped pods' logs (kubectl logs) before the operator deletes their Jobs."""
        core = kubernetes.client.CoreV1Api(self._api())
        seen = dict(self.logs_seen)
        for pod in core.list_namespaced_pod(NAMESPACE).items:
            name = pod.metadata.name
            gate = next(
                (s for s in pod.status.init_container_statuses or [] if s.name == "cronlock-gate"),
                None,
            )
            if name in seen or gate is None or gate.state.terminated is None:
                continue
            logs = {}
            for container in ("cronlock", "cronlock-gate"):
                with contextlib.suppress(kubernetes.client.ApiException):
                    logs[container] = core.read_namespaced_pod_log(
                        name, NAMESPACE, container=container
                    )
            seen[name] = logs
            self.logs_seen.append((name, logs))

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        with open(log, "ab") as output:
            process = subprocess.Popen(
                argv,
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (ENV_DIR / f"demo-{name}.pid").write_text(f"{process.pid}\n")

    def _wait_for_line(self, log: Path, line: str, what: str) -> None:
        wait_for(lambda: log.exists() and line in log.read_text(errors="replace"), 60, what)

    def _api(self) -> kubernetes.client.ApiClient:
        if self.api is None:
            raise DemoError("the control plane is not running")
        return self.api

    def _plane(self) -> ControlPlane:
        return ControlPlane(Path(self.env["KUBECONFIG"]), self.env, ENV_DIR)


class DemoError(Exception):
    """A step of the demo failed; the message says which and why."""


def stop_everything(env: dict[str, str]) -> None:
    """Stop the operator, the node (its pods release their Leases), the control plane."""
    for name in ("operator",):
        pid_file = ENV_DIR / f"demo-{name}.pid"
        if not pid_file.exists():
            continue
        pid = int(pid_file.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, 30)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        pid_file.unlink()
    subprocess.run(
        [str(ROOT / "tests" / "controlplane" / "node"), "down"],
        env=dict(env, CRONLOCK_TESTENV_DIR=str(ENV_DIR)),
        capture_output=True,
        check=False,
    )
    subprocess.run(
        [str(ROOT / "tests" / "controlplane" / "down")],
        env=dict(env, CRONLOCK_TESTENV_DIR=str(ENV_DIR)),
        capture_output=True,
        check=False,
    )


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    """Running, and not a zombie (our own children stay zombies until reaped)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make demo",
        description="Show cronlock skipping an overlapping CronJob run on a local cluster.",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the cluster, its node and the operator running to explore with kubectl",
    )
    parser.add_argument(
        "--quick", action="store_true", help="do not wait for the schedule's next tick"
    )
    parser.add_argument("--stop", action="store_true", help="stop what --keep left running")
    args = parser.parse_args(argv)
    style = Style()
    if args.stop:
        stop_everything(dict(os.environ))
        style.good("stopped the demo's operator, node and control plane")
        return 0
    if os.geteuid() != 0:
        style.bad(
            "the demo's node needs root: the kubelet, containerd and runc make network "
            "namespaces, mounts and cgroups. Run it as root in a VM or container."
        )
        return 1
    # A fresh start: whatever an earlier demo left behind goes first.
    stop_everything(dict(os.environ))
    shutil.rmtree(ENV_DIR, ignore_errors=True)
    ENV_DIR.mkdir(parents=True)
    demo = Demo(style)
    keep = args.keep
    try:
        demo.start_controlplane()
        demo.start_node()
        demo.start_operator()
        demo.apply_example()
        holder, skipped = demo.overlap()
        skips = [skipped] if args.quick else [skipped, demo.tick(skipped)]
        demo.report(skips)
        style.step("Done")
        style.good(f"{' and '.join(skips)} skipped while {holder} kept the lock: no overlap.")
    except (DemoError, AssertionError, kubernetes.client.ApiException, OSError) as error:
        style.bad(f"demo failed: {error}")
        for name in ("operator.log", "node/logs/kubelet.log"):
            style.output(f"--- {name} (last lines)\n{_tail(ENV_DIR / name)}")
        keep = False
        demo.stop()
        return 1
    except KeyboardInterrupt:
        demo.stop()
        return 130
    if keep:
        print(
            "\nEverything is still running. Explore with kubectl:\n"
            f"  export KUBECONFIG={demo.env['KUBECONFIG']}\n"
            f"  export PATH={Path(demo.env['KUBECONFIG']).parent / 'bin'}:{VENV_BIN}:$PATH\n"
            f"  kubectl get cronjob,jobs,pods,leases -n {NAMESPACE}\n"
            f"  kubectl cronlock status -n {NAMESPACE}\n"
            "Stop it with: make demo DEMO_ARGS=--stop",
            flush=True,
        )
        return 0
    style.step("Stopping what the demo started (use --keep to leave it running)")
    demo.stop()
    style.good(f"total {time.monotonic() - style.started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
