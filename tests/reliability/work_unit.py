"""The work unit both checkers run, as one script: the process checker's as the command of
`cronlock-sidecar run` (checker.py), the pod checker's as a guarded pod's main container
(pod_work.py).

It holds an exclusive, non-blocking `flock` on a shared file for its whole life (a failed
`flock` is an overlap, whatever any clock says), records its start and end, and writes its
fencing token into a shared store every 0.2 s, which refuses a token older than the newest
it has seen. Each checker gives the prelude: where the files are (`lock_path`,
`store_path`), the token (`token`), and how an event is recorded (`record`).

A lock of N permits (`cronlock.io/permits`, issue 58): the prelude also sets `slots` = N
and `permit`, the run's permit. The unit then takes the first free one of N files
`<lock_path>.K`, so an overlap is a unit that finds all N taken, more than N alive at
once; and the fencing store is the permit's own, `<store_path>.<permit>`, since a token
grows per permit. Without them (`slots` 1) it is the one-holder unit above.
"""

from __future__ import annotations

import textwrap

FENCED_WORK = textwrap.dedent(
    """
    slots = int(globals().get("slots", 1))
    permit = int(globals().get("permit", 0))
    fenced_path = store_path if slots == 1 else f"{store_path}.{permit}"
    def fenced_write(stage):
        with open(fenced_path, "a+") as store:
            fcntl.flock(store, fcntl.LOCK_EX)
            store.seek(0)
            highest = max([int(word) for word in store.read().split()] or [0])
            if token < highest:
                record("refused", stage=stage, highest=highest)
                return
            store.write(f"{token}\\n")
    held = []
    for slot in [lock_path] if slots == 1 else [f"{lock_path}.{k}" for k in range(slots)]:
        lock = os.open(slot, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            continue
        held.append(lock)
        break
    if not held:
        # `slots` other work units are alive: counted, then work on as the holder would.
        record("overlap")
    record("start")
    deadline = time.monotonic() + float(seconds)
    while True:
        fenced_write("work")
        if time.monotonic() >= deadline:
            break
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    record("end")
    """
)


def work_script(prelude: str) -> str:
    """The prelude (dedented), then the fenced work."""
    return textwrap.dedent(prelude) + FENCED_WORK
