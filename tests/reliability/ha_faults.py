"""The faults of an HA control plane (tests/controlplane/controlplane.py with
CRONLOCK_CONTROLPLANE_HA=1: 3 etcd members, 2 API servers behind a balancer), for both
checkers: the process checker (`checker.py --ha`) and the pod checker (`pods.py --ha`).

Each fault undoes itself: the killed etcd leader is started again on its data, a paused API
server or cut link resumes, in a `finally`. What each returns: its detail for the report,
and the monotonic time the control plane served again.
"""

from __future__ import annotations

import random
import time

from tests.support.processes import ControlPlaneProcesses

HA_FAULTS = (
    "kill-etcd-leader",
    "restart-one-apiserver",
    "cut-apiserver-from-etcd",
    "pause-one-apiserver",
)
# While these last, one API server's answers hang: a checker does not count the time it
# cannot read the control plane against the lock.
HA_API_AWAY = frozenset({"cut-apiserver-from-etcd", "pause-one-apiserver"})


def is_ha(components: ControlPlaneProcesses | None) -> bool:
    return components is not None and "balancer" in components.components()


def inject(
    kind: str, components: ControlPlaneProcesses, choose: random.Random, ttl: float
) -> tuple[str, float]:
    """Inject `kind` and undo it 2 s to ttl + 4 s later; (detail, when it served again)."""
    seconds = choose.uniform(2, ttl + 4)
    ports = components.ha_ports()
    apiservers = sorted(ports["apiservers"])
    if kind == "kill-etcd-leader":
        leader = components.etcd_leader()
        components.restart(leader, down_for=seconds)
        return f"{leader} down {seconds:.1f}s", components.wait_etcd_member(leader)
    if kind == "cut-apiserver-from-etcd":
        # The second API server reaches etcd through the links (controlplane.py).
        name, targets = apiservers[-1], sorted(ports["links"])
    elif kind == "pause-one-apiserver":
        name = choose.choice(apiservers)
        targets = [name]
    elif kind == "restart-one-apiserver":
        name = choose.choice(apiservers)
        components.restart(name)
        return name, components.wait_ready(server=components.apiserver_url(name))
    else:
        raise ValueError(f"{kind} is not a fault of an HA control plane")
    for target in targets:
        components.pause(target)
    try:
        time.sleep(seconds)
    finally:
        for target in targets:
            components.resume(target)
    return f"{name} {seconds:.1f}s", components.wait_ready(server=components.apiserver_url(name))
