"""The Go tools the tests build from pinned modules (tests/controlplane/gotool), one home."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

CONTROLPLANE = Path(__file__).resolve().parents[1] / "controlplane"


@functools.cache
def gotool(name: str) -> str:
    """The path of tool `name` (actionlint, argohealth, crane, ...), built on first use."""
    built = subprocess.run(
        [str(CONTROLPLANE / "gotool"), name],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return built.stdout.strip()
