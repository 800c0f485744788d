"""The versions the tests pin: tests/controlplane/versions.env, read in one place.

The shell scripts source that file; Python reads it here (`NAME=value`, an optional
`"..."` around the value, `#` starting a comment)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

VERSIONS = Path(__file__).resolve().parent.parent / "controlplane" / "versions.env"


@cache
def _pins(path: Path = VERSIONS) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            name, value = line.split("=", 1)
            pins[name.strip()] = value.strip().strip('"')
    return pins


def pinned(name: str, path: Path = VERSIONS) -> str:
    """The value versions.env pins for NAME; a clear error when it pins none."""
    try:
        return _pins(path)[name]
    except KeyError:
        raise LookupError(f"{path} pins no {name}") from None


def compatible_releases(path: Path = VERSIONS) -> list[str]:
    """Every Kubernetes release the chart admits and the compatibility ring builds."""
    return pinned("COMPATIBLE_KUBERNETES", path).split()
