"""`retcon-sandbox completion bash|zsh|fish`: a shell completion script, generated from the argparse
parsers themselves (so it cannot drift from them), with no dependency.

It completes commands and subcommands, each command's options, and the choices of an option
that has them (--sandbox, --setup-network, --skip, the shell here); anything else (a SPEC, a
directory, a command line) falls back to the shell's own file-name completion. zsh runs the
same function through its bash compatibility layer (bashcompinit); fish gets the same walk as
a fish function.

An action may carry `completions`, the words its value takes when they cannot be argparse
`choices` (the image names after `images build`: `nargs="*"` with choices refuses no names).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from retcon_sandbox.errors import EXIT_OK

FUNCTION = "_retcon_sandbox"
_SAFE = re.compile(r"[A-Za-z0-9_.:/=+-]*")  # words written unquoted into the script


@dataclass(frozen=True)
class Node:
    """One parser: its command path ("" for the top, "images build"), its subcommands, the
    choices of its positional arguments, its options, those that take a value, and those with
    fixed choices."""

    path: str
    commands: tuple[str, ...]
    positional: tuple[str, ...]
    options: tuple[str, ...]
    valued: tuple[str, ...]
    choices: tuple[tuple[str, tuple[str, ...]], ...]


def nodes(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Node]:
    commands: list[str] = []
    positional: list[str] = []
    children: list[tuple[str, argparse.ArgumentParser]] = []
    options: list[str] = []
    valued: list[str] = []
    choices: list[tuple[str, tuple[str, ...]]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                commands.append(name)
                children.append((name, child))
        elif action.option_strings:
            options += action.option_strings
            if action.nargs != 0:
                valued += action.option_strings
                if action.choices is not None:
                    words = tuple(str(c) for c in action.choices)
                    choices += [(option, words) for option in action.option_strings]
        else:
            positional += [str(c) for c in getattr(action, "completions", action.choices) or ()]
    yield Node(path, tuple(commands), tuple(positional), tuple(options), tuple(valued),
               tuple(choices))
    for name, child in children:
        yield from nodes(child, f"{path} {name}".strip())


def _word(text: str) -> str:
    if not _SAFE.fullmatch(text):
        raise ValueError(f"cannot write {text!r} into a completion script")
    return text


def bash(parser: argparse.ArgumentParser, program: str) -> str:
    tree = list(nodes(parser))
    walk, values, words = [], [], []
    for node in tree:
        for name in node.commands:
            child = f"{node.path} {name}".strip()
            walk.append(f'            "{node.path}:{_word(name)}") node="{child}" ;;')
        if node.valued:
            keys = "|".join(f'"{node.path}:{_word(o)}"' for o in node.valued)
            walk.append(f"            {keys}) ((i++)) ;;")
        for option, choice in node.choices:
            values.append(f'        "{node.path}:{option}") words="{" ".join(map(_word, choice))}"'
                          " ;;")
        if node.valued:
            keys = "|".join(f'"{node.path}:{o}"' for o in node.valued)
            values.append(f"        {keys}) return 0 ;;  # a value: file names")
        offered = [*node.commands, *node.positional, *node.options]
        words.append(f'        "{node.path}") words="{" ".join(map(_word, offered))}" ;;')
    lines = [
        f"# {program} completion for bash: eval \"$({program} completion bash)\"",
        f"{FUNCTION}() {{",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" node="" words="" i w',
        "    ((COMP_CWORD > 0)) && prev=\"${COMP_WORDS[COMP_CWORD-1]}\"",
        "    COMPREPLY=()",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        w="${COMP_WORDS[i]}"',
        '        case "$node:$w" in',
        *walk,
        "        esac",
        "    done",
        '    case "$node:$prev" in',
        *values,
        "    esac",
        '    if [[ -z "$words" ]]; then',
        '        case "$node" in',
        *words,
        "        esac",
        '        if [[ "$cur" != -* ]]; then  # options only after a dash',
        "            local kept=() x",
        "            for x in $words; do [[ $x == -* ]] || kept+=(\"$x\"); done",
        '            words="${kept[*]}"',
        "        fi",
        "    fi",
        '    [[ -n "$words" ]] && COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "    return 0",
        "}",
        f"complete -o default -F {FUNCTION} {_word(program)}",
    ]
    return "\n".join(lines) + "\n"


def zsh(parser: argparse.ArgumentParser, program: str) -> str:
    return (f"# {program} completion for zsh: eval \"$({program} completion zsh)\" (after "
            "compinit)\nautoload -U +X bashcompinit && bashcompinit\n"
            + bash(parser, program).split("\n", 1)[1])


def _fish_cases(tree: list[Node]) -> tuple[list[str], list[str], list[str]]:
    """The `case` lines of fish's walk over the words, of an option's values, and of each
    command's words."""
    walk: list[str] = []
    values: list[str] = []
    words: list[str] = []
    for node in tree:
        for name in node.commands:
            child = f"{node.path} {name}".strip()
            walk += [f"            case '{node.path}:{_word(name)}'",
                     f"                set node '{child}'"]
        if node.valued:
            keys = " ".join(f"'{node.path}:{_word(o)}'" for o in node.valued)
            walk += [f"            case {keys}", "                set value 1"]
        for option, choice in node.choices:
            values += [f"        case '{node.path}:{option}'",
                       f"            printf '%s\\n' {' '.join(map(_word, choice))}"]
        offered = [*node.commands, *node.positional, *node.options]
        files = "0" if node.commands or node.positional else "1"
        words += [f"        case '{node.path}'",
                  f"            set words {' '.join(map(_word, offered))}",
                  f"            set files {files}"]
    return walk, values, words


def fish(parser: argparse.ArgumentParser, program: str) -> str:
    """The same walk as bash's, as a fish function that prints the candidates: a command's
    value or positional with no fixed words falls back to file names, as in bash."""
    walk, values, words = _fish_cases(list(nodes(parser)))
    lines = [
        f"# {program} completion for fish: {program} completion fish | source",
        f"function {FUNCTION}",
        "    set -l tokens (commandline -opc)",
        "    set -l cur (commandline -ct)",
        '    set -l node ""',
        "    set -l value 0",
        "    for w in $tokens[2..-1]",
        "        if test $value = 1",
        "            set value 0",
        "            continue",
        "        end",
        '        switch "$node:$w"',
        *walk,
        "        end",
        "    end",
        "    if test $value = 1  # the value of the last option",
        '        switch "$node:$tokens[-1]"',
        *values,
        "        case '*'",
        '            __fish_complete_path "$cur"',
        "        end",
        "        return",
        "    end",
        "    set -l words",
        "    set -l files 0",
        '    switch "$node"',
        *words,
        "    end",
        "    for x in $words",
        "        if string match -q -- '-*' \"$cur\"; or not string match -q -- '-*' \"$x\"",
        "            printf '%s\\n' $x  # options only after a dash",
        "        end",
        "    end",
        '    if test $files = 1; and not string match -q -- \'-*\' "$cur"',
        '        __fish_complete_path "$cur"',
        "    end",
        "end",
        f"complete -c {_word(program)} -e",
        f"complete -c {_word(program)} -f -a '({FUNCTION})'",
    ]
    return "\n".join(lines) + "\n"


SHELLS: dict[str, Callable[[argparse.ArgumentParser, str], str]] = {"bash": bash, "zsh": zsh,
                                                                    "fish": fish}


def run(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.build_parser()
    print(SHELLS[args.shell](parser, parser.prog), end="")
    return EXIT_OK
