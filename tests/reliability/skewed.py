"""`cronlock-sidecar` on a node whose wall clock is off: `python -m tests.reliability.skewed
OFFSET ARGS...` runs `cronlock-sidecar ARGS...` with every wall-clock reading moved by OFFSET
seconds (+ ahead, - behind).

The sidecar reads the wall clock in one place, `SystemClock.now()`: the time it writes into
`renewTime`/`acquireTime` and judges other holders' `renewTime` by. Moving that reading is
what a node with a wrong clock does to cronlock; its monotonic clock (its own deadlines) is
left alone, as NTP steps do not move it either. Only the checker starts this.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta

from cronlock_sidecar import cli
from cronlock_sidecar.holding import lease


def skew(offset: float) -> None:
    """From now on, this process's sidecar reads the wall clock `offset` seconds off."""
    shift = timedelta(seconds=offset)
    real_now = lease.SystemClock.now

    def now(self: lease.SystemClock) -> datetime:
        return real_now(self) + shift

    lease.SystemClock.now = now  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    if len(argv) < 1:
        print("usage: python -m tests.reliability.skewed OFFSET ARGS...", file=sys.stderr)
        return 78
    skew(float(argv[0]))
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
