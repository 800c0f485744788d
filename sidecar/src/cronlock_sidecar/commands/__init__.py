"""The three commands the sidecar runs: `hold` (the native sidecar), `gate` (waits for
the hold's decision), `run` (standalone: take the lock, run a command, give it back)."""
