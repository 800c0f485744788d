"""tests/support/versions.py: the one reader of tests/controlplane/versions.env."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.versions import VERSIONS, compatible_releases, pinned


def test_values_read_as_the_shell_reads_them(tmp_path: Path) -> None:
    env = tmp_path / "versions.env"
    env.write_text(
        "# a comment\n"
        "PLAIN=v1.2.3\n"
        "COMMENTED=v3.5.3   # why it is pinned\n"
        'COMPATIBLE_KUBERNETES="v1.30.14 v1.31.14"\n'
    )
    assert pinned("PLAIN", env) == "v1.2.3"
    assert pinned("COMMENTED", env) == "v3.5.3"
    assert compatible_releases(env) == ["v1.30.14", "v1.31.14"]
    with pytest.raises(LookupError, match="pins no MISSING"):
        pinned("MISSING", env)


def test_every_pin_reads_the_same_as_bash_sourcing_the_file() -> None:
    names = ["KUBERNETES_VERSION", "ETCD_VERSION", "COMPATIBLE_KUBERNETES", "ARGO_CD_VERSION"]
    script = f". {VERSIONS}; " + "; ".join(f'printf "%s\\n" "${name}"' for name in names)
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert shell.stdout.splitlines() == [pinned(name) for name in names]
    assert compatible_releases()[-1] == pinned("KUBERNETES_VERSION")
