"""`cronlock completion bash|zsh|fish`, run by the shells themselves: the script is sourced
and the shell asked what it completes, as on Tab; and kubectl_complete-cronlock's answer in
cobra's form (kubectl itself asks it in tests/integration/test_kubectl_completion.py)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cronlock_operator.status import cli as status
from tests.support.papers import marked_block
from tests.support.paths import ROOT


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
        status.main(["completion", "powershell"])
    assert exited.value.code == 2
    assert "invalid choice: 'powershell'" in capsys.readouterr().err


def fish_completed(script_path: Path, line: str) -> list[str]:
    """What fish offers for `line` (the last word being typed), by fish's own `complete -C`."""
    done = subprocess.run(
        ["fish", "--no-config", "-c", f"source {script_path}; complete -C{shlex.quote(line)}"],
        capture_output=True, text=True, timeout=30, check=True, cwd=ROOT,
    )  # fmt: skip
    return [word.split("\t")[0] for word in done.stdout.splitlines()]


def test_fish_completes_subcommands_flags_formats_and_else_file_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cronlock.fish"
    path.write_text(script("fish", capsys))
    assert fish_completed(path, "cronlock st") == ["status"]
    assert set(fish_completed(path, "cronlock ")) >= {
        "status", "lint", "freeze", "unfreeze", "completion",
    }  # fmt: skip
    assert fish_completed(path, "cronlock status --out") == ["--output"]
    assert fish_completed(path, "cronlock status -n x -o js") == ["json"]
    assert fish_completed(path, "cronlock freeze --sto") == ["--stop-running", "--store-secret"]
    assert fish_completed(path, "kubectl-cronlock completion f") == ["fish"]
    # lint's manifests: no word of cronlock's, so fish offers file names, and only them.
    assert fish_completed(path, "cronlock lint manifests/exam") == ["manifests/examples/"]
    assert "status" not in fish_completed(path, "cronlock lint ")


def test_kubectl_complete_answers_in_cobras_form(capsys: pytest.CaptureFixture[str]) -> None:
    """One word a line, then `:4` (no file names) or `:0` (the shell's file names)."""

    def answer(*words: str) -> list[str]:
        assert status.kubectl_complete(list(words)) == 0
        return capsys.readouterr().out.splitlines()

    assert answer("st") == ["status", ":4"]
    assert answer("status", "-A", "-o", "") == ["table", "wide", "json", "yaml", "name", ":4"]
    assert answer("freeze", "--sto") == ["--stop-running", "--store-secret", ":4"]
    assert answer("lint", "manifests/") == [":0"]
    assert {"status", "lint", "freeze", "unfreeze", "completion", ":4"} <= set(answer(""))


USAGE_MD = ROOT / "docs" / "USAGE.md"
SCRIPTS = Path(sys.executable).parent  # pip's console scripts (make venv)


def test_usages_bash_block_registers_the_function(tmp_path: Path) -> None:
    block = marked_block(USAGE_MD, "completion-bash")
    done = subprocess.run(
        ["bash", "-c", f"{block}\ncomplete -p cronlock"],
        env={"PATH": f"{SCRIPTS}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "complete -o default -F _cronlock cronlock", done.stderr


def test_usages_fish_block_completes(tmp_path: Path) -> None:
    block = marked_block(USAGE_MD, "completion-fish")
    done = subprocess.run(
        ["fish", "--no-config", "-c", f"{block}\ncomplete -C'cronlock unf'"],
        env={"PATH": f"{SCRIPTS}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["unfreeze"], done.stderr


def test_the_krew_completer_usage_and_the_caveats_write_answers_as_kubectl_asks(
    tmp_path: Path,
) -> None:
    """The block is the manifest's caveat (hack/krew), and the completer it writes runs the
    plugin's hidden `__complete`, whichever version krew has linked."""
    loader = importlib.machinery.SourceFileLoader("krew", str(ROOT / "hack" / "krew"))
    spec = importlib.util.spec_from_loader("krew", loader)
    assert spec is not None
    krew = importlib.util.module_from_spec(spec)
    loader.exec_module(krew)
    block = marked_block(USAGE_MD, "krew-completer")
    assert block == textwrap.dedent("      " + krew.COMPLETER_SETUP)
    assert block in krew.plugin_manifest("0.1.0", {}).replace("\n      ", "\n")
    root = tmp_path / "krew"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "kubectl-cronlock").symlink_to(SCRIPTS / "kubectl-cronlock")
    env = {"PATH": f"{root / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "KREW_ROOT": str(root)}
    subprocess.run(["bash", "-euc", block], env=env, check=True, timeout=30)
    asked = subprocess.run(
        ["kubectl_complete-cronlock", "status", "-o", "w"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert asked.stdout.splitlines() == ["wide", ":4"], asked.stderr
