"""`tests/controlplane/node` for clusters of their own (`--cluster`, nodes 3 and 4): what
their pods reach, the late-start CNI plugin as containerd calls it, and the refusals of
options that cannot work."""

from __future__ import annotations

import dataclasses
import importlib
import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.node import HOST_LINK_IPS
from tests.support.paths import ROOT

CONTROLPLANE = ROOT / "tests" / "controlplane"


@pytest.fixture
def node_py() -> Iterator[ModuleType]:
    """tests/controlplane/node.py as the script imports it (beside its `controlplane`)."""
    sys.path.insert(0, str(CONTROLPLANE))
    try:
        yield importlib.import_module("node")
    finally:
        sys.path.remove(str(CONTROLPLANE))
        for name in ("node", "controlplane"):
            sys.modules.pop(name, None)


def test_a_cluster_nodes_pods_reach_their_link_and_their_own_relay_only(
    node_py: ModuleType,
) -> None:
    for index in (3, 4, 5):
        node = dataclasses.replace(node_py.NODES[index], own_cluster=True)
        assert node.leads
        assert not node.first
        # Nothing through the host but its own link: not node 1's (another control
        # plane's relay, the registry) nor the Service range there.
        assert node_py.upstream(node) == ()
        assert node_py.pod_routes(node) == (node.link_net, "203.0.113.0/25")
        assert "kube-scheduler" in node.processes
        assert "pod-relay" in node.processes
        assert node.host_link_ip == HOST_LINK_IPS[index]
    # The fleet's node 2 as it was: node 1's link and the Service range through the host.
    fleet = node_py.NODES[2]
    assert node_py.upstream(fleet) == ("203.0.113.0/25", "198.51.100.0/30")
    assert fleet.processes == ("kubelet", "containerd", "node-relay")


def test_nodes_use_disjoint_addresses(node_py: ModuleType) -> None:
    nets = [ipaddress.ip_network(net) for node in node_py.NODES.values() for net in node.reserved]
    nets.remove(ipaddress.ip_network("203.0.113.0/25"))  # the Service range, node 1's
    for index, net in enumerate(nets):
        assert not any(net.overlaps(other) for other in nets[index + 1 :]), net


def test_the_late_start_plugin_waits_then_passes_the_bridges_result_on(
    node_py: ModuleType, tmp_path: Path
) -> None:
    node = dataclasses.replace(node_py.NODES[4], own_cluster=True, pod_start_delay=1.5)
    [entry] = node_py.slow_start(tmp_path, node)
    plugin = tmp_path / "cni" / "bin" / entry["type"]
    previous = {"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.98/27"}]}
    config = {"cniVersion": "1.0.0", "name": "n", **entry, "prevResult": previous}

    def call(command: str) -> tuple[float, str]:
        started = time.monotonic()
        result = subprocess.run(
            [str(plugin)],
            input=json.dumps(config),
            env={**os.environ, "CNI_COMMAND": command},
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return time.monotonic() - started, result.stdout

    took, out = call("ADD")
    assert took >= 1.5
    assert json.loads(out) == previous
    took, out = call("DEL")
    assert took < 1.5
    assert out == ""
    assert "1.0.0" in json.loads(call("VERSION")[1])["supportedVersions"]
    # Without a delay there is no plugin in the chain.
    assert node_py.slow_start(tmp_path, node_py.NODES[3]) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--index", "1", "--cluster", "{tmp}"], "--cluster needs --index 2 or more"),
        (["--index", "3", "--cluster", "{tmp}"], "holds no control plane"),
        (["--index", "3", "--pod-start-delay", "500"], "0 to 120 seconds"),
    ],
)
def test_options_that_cannot_work_are_refused_saying_why(
    args: list[str], says: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(CONTROLPLANE / "node"), "up", *(arg.format(tmp=tmp_path) for arg in args)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode != 0
    assert says in result.stderr
