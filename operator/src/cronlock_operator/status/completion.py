"""`cronlock completion bash|zsh`: a completion script made from the CLI's own parser, so
it offers exactly the subcommands and flags there are (and `-o`'s formats).

bash: `source <(cronlock completion bash)` (or save it under
/etc/bash_completion.d/cronlock). zsh: `source <(cronlock completion zsh)`, which loads
zsh's bashcompinit and the same function. Both complete `cronlock` and `kubectl-cronlock`.
"""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh")


def _subcommands(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(parser: argparse.ArgumentParser) -> list[str]:
    """Its flags, and the choices of its positional arguments (completion's shell)."""
    positional = [
        str(choice)
        for action in parser._actions
        if not action.option_strings
        and action.choices
        and not isinstance(action, argparse._SubParsersAction)
        for choice in action.choices
    ]
    flags = sorted(option for action in parser._actions for option in action.option_strings)
    return [*positional, *flags]


def _choices(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for action in parser._actions:
        if action.choices and action.option_strings:
            for option in action.option_strings:
                found[option] = [str(choice) for choice in action.choices]
    return found


def bash(top: argparse.ArgumentParser) -> str:
    commands = _subcommands(top)
    values = []
    for name, sub in commands.items():
        for option, choices in _choices(sub).items():
            values.append(f"    {name}:{option}) words={shlex.quote(' '.join(choices))} ;;")
    flags = [
        f"    {name}) words={shlex.quote(' '.join(_words(sub)))} ;;"
        for name, sub in commands.items()
    ]
    top_words = " ".join([*commands, *_words(top)])
    return "\n".join(
        [
            "# cronlock completion (`cronlock completion bash`), made from the CLI's parser.",
            "_cronlock() {",
            '  local cur=${COMP_WORDS[COMP_CWORD]} prev="" command="" words="" word i',
            "  (( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD-1]}",
            "  for (( i = 1; i < COMP_CWORD; i++ )); do",
            "    word=${COMP_WORDS[i]}",
            "    case $word in -*) ;; *) command=$word; break ;; esac",
            "  done",
            '  case "$command:$prev" in',
            *values,
            "    *)",
            "  case $command in",
            f"    '') words={shlex.quote(top_words)} ;;",
            *flags,
            "  esac ;;",
            "  esac",
            "  # Where nothing matches (lint's manifests, a flag's own value), -o default",
            "  # has the shell complete a file name.",
            '  COMPREPLY=($(compgen -W "$words" -- "$cur"))',
            "}",
            "complete -o default -F _cronlock cronlock kubectl-cronlock",
            "",
        ]
    )


def zsh(top: argparse.ArgumentParser) -> str:
    return "\n".join(
        [
            "#compdef cronlock kubectl-cronlock",
            "# cronlock completion for zsh (`cronlock completion zsh`): bash's, through",
            "# zsh's bashcompinit.",
            "autoload -U +X compinit && compinit -u",
            "autoload -U +X bashcompinit && bashcompinit",
            bash(top),
        ]
    )


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    completion = commands.add_parser(
        "completion",
        help="print a completion script for bash or zsh",
        description="Print a completion script: source <(cronlock completion bash) (or zsh).",
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell: bash or zsh")


def run(top: argparse.ArgumentParser, shell: str) -> int:
    print(bash(top) if shell == "bash" else zsh(top), end="")
    return 0
