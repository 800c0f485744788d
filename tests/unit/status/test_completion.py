"""`cronlock completion bash|zsh`, run by the shells themselves: the script is sourced and
its function asked what it completes, as the shell asks it on Tab."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cronlock_operator.status import cli as status


def script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert status.main(["completion", shell]) == 0
    return capsys.readouterr().out


def completed(script_path: Path, *words: str, shell: str = "bash") -> list[str]:
    """What the function offers for the command line `words` (the last one being typed)."""
    line = " ".join(f"'{word}'" for word in words)
    setup = "setopt ksharrays; " if shell == "zsh" else ""
    program = (
        f"{setup}source {script_path}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
        'COMPREPLY=(); _cronlock; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        [shutil.which(shell) or shell, "-c", program],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    offered = [word for word in done.stdout.splitlines() if word]
    # zsh's compgen (bashcompinit) leaves the match with what is typed to compadd, which
    # offers only the replies that start with it: as the shell does.
    return [word for word in offered if word.startswith(words[-1])] if shell == "zsh" else offered


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_shell_completes_subcommands_flags_and_formats(
    shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"cronlock.{shell}"
    path.write_text(script(shell, capsys))
    assert completed(path, "cronlock", "st", shell=shell) == ["status"]
    assert set(completed(path, "cronlock", "", shell=shell)) >= {
        "status", "lint", "freeze", "unfreeze", "completion",
    }  # fmt: skip
    assert completed(path, "cronlock", "status", "--out", shell=shell) == ["--output"]
    assert completed(path, "cronlock", "status", "-n", "x", "-o", "js", shell=shell) == ["json"]
    assert completed(path, "cronlock", "freeze", "--sto", shell=shell) == [
        "--stop-running",
        "--store-secret",
    ]
    assert completed(path, "kubectl-cronlock", "completion", "z", shell=shell) == ["zsh"]
    # lint's manifests: nothing from the function, so the shell completes file names.
    assert completed(path, "cronlock", "lint", "manifests/cron", shell=shell) == []


def test_zsh_registers_the_function_for_both_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cronlock.zsh"
    path.write_text(script("zsh", capsys))
    done = subprocess.run(
        ["zsh", "-c", f"source {path}; print -r -- $_comps[cronlock] $_comps[kubectl-cronlock]"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert done.stdout.split().count("_cronlock") == 2, done.stdout


def test_bash_falls_back_to_file_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cronlock.bash"
    path.write_text(script("bash", capsys))
    done = subprocess.run(
        ["bash", "-c", f"source {path}; complete -p cronlock kubectl-cronlock"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines() == [
        "complete -o default -F _cronlock cronlock",
        "complete -o default -F _cronlock kubectl-cronlock",
    ]


def test_an_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        status.main(["completion", "fish"])
    assert exited.value.code == 2
    assert "invalid choice: 'fish'" in capsys.readouterr().err
