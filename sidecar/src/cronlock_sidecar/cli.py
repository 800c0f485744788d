"""`cronlock-sidecar`: parse and validate everything, then hand over to hold, gate or run."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from cronlock_sidecar.contract import EXIT_CONFIG
from cronlock_sidecar.options import ConfigError, Options, parse_options
from cronlock_sidecar.pod import logs

if TYPE_CHECKING:
    from typing import Protocol

    from cronlock_sidecar.holding.outcomes import Clock
    from cronlock_sidecar.transport.seam import LeaseTransport

    class StoreClient(LeaseTransport, Protocol):
        """A store's client: a LeaseTransport the command closes when it is done."""

        def close(self) -> None: ...


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Exit codes: 0 ok, 75 skipped, 69 unavailable or forbidden, 78 bad configuration, 70 lost."""
    arguments = sys.argv[1:] if argv is None else argv
    environment = os.environ if env is None else env
    try:
        options = parse_options(arguments, environment)
    except ConfigError as error:
        logs.fatal(str(error))
        return EXIT_CONFIG
    logs.configure(options.log_format, options.log_level)
    # Each command imports only what it uses: the sidecar's resident memory is a goal,
    # and the gate's start is on every run's way to its work (docs/PERFORMANCE.md).
    if options.command == "gate":
        from cronlock_sidecar.commands.gate import gate

        return gate(Path(options.run_dir), options.gate_timeout)
    from cronlock_sidecar.holding.outcomes import SystemClock

    # One clock for the hold and its store: a store shifts the times it reads onto the
    # clock the hold judges them on (transport/frames.py).
    clock = SystemClock()
    transport = _transport(options, environment, clock)
    if isinstance(transport, int):
        return transport
    try:
        if options.command == "hold":
            return _hold(options, transport, clock)
        from cronlock_sidecar.commands.run import Runner

        return Runner(options, transport, clock).execute()
    finally:
        transport.close()


def _transport(options: Options, environment: Mapping[str, str], clock: Clock) -> StoreClient | int:
    """The lock's store: the Lease through the API server, or Redis/PostgreSQL when asked."""
    timeout = min(5.0, max(1.0, options.renew))
    if options.store is not None:
        # Each store's client is imported only when it is chosen.
        if options.store.kind == "redis":
            from cronlock_sidecar.transport.redisstore import RedisLeaseStore

            return RedisLeaseStore(options.store, clock.now, timeout)
        from cronlock_sidecar.transport.pgstore import PostgresLeaseStore

        return PostgresLeaseStore(options.store, clock.now, timeout)
    from cronlock_sidecar.transport.kubeapi import KubeLeaseClient
    from cronlock_sidecar.transport.kubeconfig import KubeConfigError, load_cluster

    try:
        cluster = load_cluster(environment)
    except KubeConfigError as error:
        logs.fatal(str(error))
        return EXIT_CONFIG
    return KubeLeaseClient(cluster, timeout=timeout)


def _hold(options: Options, transport: LeaseTransport, clock: Clock) -> int:
    from cronlock_sidecar.commands.hold import Holder
    from cronlock_sidecar.pod.endpoints import Endpoints, SidecarState
    from cronlock_sidecar.pod.stopping import StopPipe

    state = SidecarState()
    try:
        endpoints = Endpoints(state, options.port)
    except OSError as error:
        logs.fatal(f"--port: cannot listen on 0.0.0.0:{options.port}: {error}")
        return EXIT_CONFIG
    stop = threading.Event()
    stop_pipe = StopPipe(stop)

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop_pipe.request()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    endpoints.start()
    try:
        return Holder(options, transport, clock, state, stop).run()
    finally:
        endpoints.stop()


if __name__ == "__main__":
    sys.exit(main())
