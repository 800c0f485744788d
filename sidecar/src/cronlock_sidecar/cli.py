"""`cronlock-sidecar`: parse and validate everything, then hand over to hold, gate or run."""

from __future__ import annotations

import os
import sys

from cronlock_sidecar.contract import EXIT_CONFIG, EXIT_OK

# Only what every command needs is imported here: each command imports its own modules,
# and the gate's path stays as short as it can be (commands/gate.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import FrameType

    from cronlock_sidecar.holding.outcomes import Clock
    from cronlock_sidecar.options import Options
    from cronlock_sidecar.stores.url import StoreUrl
    from cronlock_sidecar.transport.seam import LeaseTransport, StoreClient


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Exit codes: 0 ok, 75 skipped, 69 unavailable or forbidden, 78 bad configuration, 70 lost."""
    arguments = sys.argv[1:] if argv is None else argv
    environment = os.environ if env is None else env
    if list(arguments) == ["--version"]:
        from cronlock_sidecar.contract import VERSION

        print(f"cronlock-sidecar {VERSION}")
        return EXIT_OK
    if list(arguments) == ["gate"]:
        # How the operator runs the gate: its settings in the environment, read without
        # the option parser; anything that parser must judge goes on below.
        from cronlock_sidecar.commands.gate import from_environment, gate

        settings = from_environment(environment)
        if settings is not None:
            return gate(settings)
    from cronlock_sidecar.options import ConfigError, parse_options
    from cronlock_sidecar.pod import logs

    try:
        options = parse_options(arguments, environment)
    except ConfigError as error:
        logs.fatal(str(error))
        return EXIT_CONFIG
    logs.configure(options.log_format, options.log_level)
    # Each command imports only what it uses: the sidecar's resident memory is a goal,
    # and its decision and the gate's start are on every run's way to its work.
    if options.command == "gate":
        from cronlock_sidecar.commands.gate import GateSettings, gate

        return gate(
            GateSettings(
                options.run_dir,
                options.gate_timeout,
                options.log_format,
                options.log_level,
                options.termination_log,
            )
        )
    if options.command == "hold":
        _warn_if_outside_skew(environment)
    from cronlock_sidecar.holding.outcomes import SystemClock

    # One clock for the hold and its store: a store shifts the times it reads onto the
    # clock the hold judges them on (stores/frames.py).
    clock = SystemClock()
    tick = None
    if options.command == "run":
        from cronlock_sidecar.options import tick_of_run

        try:
            # Judged at the start: the tick is the one this process was started for.
            tick = tick_of_run(options, clock.now())
        except ConfigError as error:
            logs.fatal(str(error))
            return EXIT_CONFIG
    transport = _transport(options, environment, clock)
    if isinstance(transport, int):
        return transport
    try:
        if options.command == "hold":
            return _hold(options, transport, clock)
        from cronlock_sidecar.commands.run import Runner

        return Runner(options, transport, clock, tick).execute()
    finally:
        transport.close()


def _transport(options: Options, environment: Mapping[str, str], clock: Clock) -> StoreClient | int:
    """The lock's store: the Lease through the API server, or Redis/PostgreSQL when asked."""
    timeout = min(5.0, max(1.0, options.renew))
    # The one door; each client is imported only when its kind is chosen (stores/open.py).
    from cronlock_sidecar.stores.open import open_transport

    if options.store is not None:
        _warn_if_unverified(options.store)
        return open_transport(options.store, environment, clock.now, timeout)
    # Only the Lease's API server comes from a kubeconfig.
    from cronlock_sidecar.pod import logs
    from cronlock_sidecar.transport.kubeconfig import KubeConfigError

    try:
        return open_transport(None, environment, clock.now, timeout)
    except KubeConfigError as error:
        logs.fatal(str(error))
        return EXIT_CONFIG


def _warn_if_outside_skew(environment: Mapping[str, str]) -> None:
    """One warning at start when the operator that injected this sidecar is of a release
    outside the supported skew (docs/UPGRADING.md); nothing when no operator says."""
    from cronlock_sidecar.contract import ENV_OPERATOR_VERSION, VERSION, within_skew

    operator = environment.get(ENV_OPERATOR_VERSION)
    if operator and not within_skew(operator, VERSION):
        import logging

        logging.getLogger("cronlock_sidecar.version").warning(
            "cronlock-sidecar %s was injected by cronlock %r, outside the supported skew "
            "(one minor release either way, docs/UPGRADING.md): upgrade or roll back "
            "one minor release at a time",
            VERSION,
            operator[:64],
        )


def _warn_if_unverified(store: StoreUrl) -> None:
    """One warning at start for a store reached without a verified TLS connection: it
    works (tests and loopback set-ups use such URLs), but a path attacker owns the lock."""
    import logging

    from cronlock_sidecar.stores.url import tls_warning

    warning = tls_warning(store)
    if warning is not None:
        logging.getLogger("cronlock_sidecar.store").warning(warning)


def _hold(options: Options, transport: LeaseTransport, clock: Clock) -> int:
    import signal
    import threading

    from cronlock_sidecar.commands.hold import Holder
    from cronlock_sidecar.pod import logs
    from cronlock_sidecar.pod.serving import Serving
    from cronlock_sidecar.pod.state import SidecarState
    from cronlock_sidecar.pod.stopping import StopPipe

    state = SidecarState()
    try:
        # The port now, so a taken one fails the sidecar before it decides; the HTTP
        # server once it has decided (pod/serving.py).
        serving = Serving(state, options.port)
    except OSError as error:
        logs.fatal(f"--port: cannot listen on 0.0.0.0:{options.port}: {error}")
        return EXIT_CONFIG
    stop = threading.Event()
    stop_pipe = StopPipe(stop)

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop_pipe.request()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return Holder(options, transport, clock, state, stop, serve=serving.start).run()
    finally:
        serving.stop()


if __name__ == "__main__":
    sys.exit(main())
