"""Where the repository and the installed sidecar are, for every ring and tool."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The sidecar's console script, installed beside this interpreter (`make venv`).
SIDECAR = Path(sys.executable).with_name("cronlock-sidecar")
