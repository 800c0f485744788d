"""`cronlock completion bash|zsh|fish`, and `kubectl cronlock <TAB>`: completion made from
the CLI's own parser, so it offers exactly the subcommands and flags there are (and `-o`'s
formats), by one rule in every shell.

bash: `source <(cronlock completion bash)` (or save it under
/etc/bash_completion.d/cronlock). zsh: `source <(cronlock completion zsh)`, which loads
zsh's bashcompinit and the same function. fish: `cronlock completion fish | source` (or
save it as ~/.config/fish/completions/cronlock.fish). Each completes `cronlock` and
`kubectl-cronlock`. `kubectl cronlock <TAB>` is kubectl's own completion (1.26 and later):
it runs the executable `kubectl_complete-cronlock` on PATH with the words typed after
`cronlock` and reads the answer in cobra's `__complete` form (`cobra`).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence

SHELLS = ("bash", "zsh", "fish")
# cobra's ShellCompDirective: 0 lets the shell complete file names when nothing is
# offered (lint's manifests), 4 (NoFileComp) keeps it from adding them to the words.
_FILES = 0
_NO_FILES = 4


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


def _tables(
    top: argparse.ArgumentParser,
) -> tuple[list[str], dict[str, list[str]], dict[str, dict[str, list[str]]]]:
    """The words each shell offers: with no subcommand yet, after each subcommand, and after
    each of a subcommand's flags that takes one of a few values."""
    commands = _subcommands(top)
    return (
        [*commands, *_words(top)],
        {name: _words(sub) for name, sub in commands.items()},
        {name: _choices(sub) for name, sub in commands.items()},
    )


def complete(top: argparse.ArgumentParser, words: Sequence[str]) -> list[str]:
    """What Tab offers after `words`, the words typed after the program's name, the last one
    the word being typed (possibly ""); [] where the shell should complete a file name."""
    *before, current = list(words) or [""]
    command = next((word for word in before if not word.startswith("-")), "")
    previous = before[-1] if before else ""
    top_words, by_command, values = _tables(top)
    if previous in values.get(command, {}):
        offered = values[command][previous]
    elif command:
        offered = by_command.get(command, [])
    else:
        offered = top_words
    return [word for word in offered if word.startswith(current)]


def cobra(top: argparse.ArgumentParser, words: Sequence[str]) -> str:
    """`complete`'s answer in the form kubectl reads from `kubectl_complete-cronlock`: one
    word a line, then `:` and the directive."""
    offered = complete(top, words)
    return "".join(f"{word}\n" for word in offered) + f":{_NO_FILES if offered else _FILES}\n"


def _fish_quote(word: str) -> str:
    return "'" + word.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish(top: argparse.ArgumentParser) -> str:
    top_words, by_command, values = _tables(top)

    def words(offered: list[str]) -> str:
        return "printf '%s\\n' " + " ".join(_fish_quote(word) for word in offered)

    lines = [
        "# cronlock completion for fish (`cronlock completion fish | source`), made from the",
        "# CLI's parser.",
        "function __cronlock_words",
        "    set -l typed (commandline -opc)",
        "    set -l command ''",
        "    for word in $typed[2..-1]",
        "        if not string match -q -- '-*' $word",
        "            set command $word",
        "            break",
        "        end",
        "    end",
        "    set -l previous ''",
        "    if test (count $typed) -gt 1",
        "        set previous $typed[-1]",
        "    end",
        '    switch "$command:$previous"',
    ]
    for name, options in values.items():
        for option, choices in options.items():
            case = _fish_quote(f"{name}:{option}")
            lines += [f"        case {case}", f"            {words(choices)}"]
    lines += [
        "        case '*'",
        "            switch $command",
        "                case ''",
        f"                    {words(top_words)}",
    ]
    for name, offered in by_command.items():
        case = _fish_quote(name)
        lines += [f"                case {case}", f"                    {words(offered)}"]
    lines += [
        "            end",
        "    end",
        "end",
        "# Where no word matches (lint's manifests, a flag's own value), file names.",
        "function __cronlock_no_word",
        "    set -l current (commandline -ct)",
        '    not __cronlock_words | string match -q -- "$current*"',
        "end",
    ]
    for program in ("cronlock", "kubectl-cronlock"):
        lines += [
            f"complete -c {program} -f -a '(__cronlock_words)'",
            f"complete -c {program} -n __cronlock_no_word -F",
        ]
    return "\n".join([*lines, ""])


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    completion = commands.add_parser(
        "completion",
        help="print a completion script for bash, zsh or fish",
        description=(
            "Print a completion script: source <(cronlock completion bash) (or zsh); "
            "cronlock completion fish | source. `kubectl cronlock <TAB>` needs none: kubectl "
            "runs kubectl_complete-cronlock, installed beside kubectl-cronlock."
        ),
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell: bash, zsh or fish")


def run(top: argparse.ArgumentParser, shell: str) -> int:
    scripts = {"bash": bash, "zsh": zsh, "fish": fish}
    print(scripts[shell](top), end="")
    return 0
