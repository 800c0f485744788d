"""Where the repository and the installed sidecar are, for every ring and tool."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The sidecar's console script, installed beside this interpreter (`make venv`).
SIDECAR = Path(sys.executable).with_name("cronlock-sidecar")
# tests/controlplane's cache (builds, images, a release's files), as its scripts find it.
CACHE = Path(
    os.environ.get("CRONLOCK_CACHE_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cronlock"
)
