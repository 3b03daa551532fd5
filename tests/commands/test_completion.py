"""`retcon-sandbox completion bash|zsh|fish`: the scripts the real CLI prints, run by real
shells."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from retcon_sandbox import cli as cli_module
from retcon_sandbox.commands.completion import bash, nodes
from tests.conftest import cli

BASH_RUN = 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); {function}; ' \
           'printf "%s\\n" "${{COMPREPLY[@]}}"'


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("completion")
    found = {}
    for shell in ("bash", "zsh", "fish"):
        result = cli("completion", shell)
        assert result.code == 0, result.err
        found[shell] = folder / f"completion.{shell}"
        found[shell].write_text(result.out)
    return found


def complete_in_bash(script: Path, line: list[str]) -> list[str]:
    proc = subprocess.run(["bash", "--norc", "-c", BASH_RUN.format(function="_retcon_sandbox"),
                           "bash", str(script), "retcon-sandbox", *line],
                          capture_output=True, text=True, check=True)
    assert proc.stderr == ""
    return proc.stdout.split()


@pytest.mark.parametrize(("line", "expected"), [
    (["ima"], ["images"]),
    (["images", "b"], ["build", "bootstrap"]),
    (["images", "prune", "--e"], ["--environments"]),
    (["execute", "--sand"], ["--sandbox"]),
    (["execute", "--sandbox", ""], ["docker", "local"]),
    (["reconstruct", "--skip", "t"], ["test"]),
    (["verify", "--setup-network", ""], ["registries", "full", "none"]),
    (["execute", "--repo", "images", "--no-c"], ["--no-cache"]),  # a value is not a command
    (["status", "spec.toml", "--j"], ["--json"]),
    (["completion", ""], ["bash", "zsh", "fish"]),
    (["images", "build", ""], ["base", "node", "rust"]),
    (["images", "build", "base", "r"], ["rust"]),
    (["images", "tag", "n"], ["node"]),
    (["execute", "sp"], []),  # a SPEC: the shell's own file-name completion
    (["execute", "--repo", ""], []),  # a directory: likewise
])
def test_bash_completes(scripts: dict[str, Path], line: list[str], expected: list[str]) -> None:
    assert complete_in_bash(scripts["bash"], line) == expected


def test_every_command_and_option_is_offered(scripts: dict[str, Path]) -> None:
    """Generated from the parsers: nothing the CLI accepts is missing."""
    tree = {node.path: node for node in nodes(cli_module.parser())}
    assert complete_in_bash(scripts["bash"], [""]) == list(tree[""].commands)
    assert {"execute", "verify", "images", "completion", "version"} <= set(tree[""].commands)
    for path, node in tree.items():
        offered = complete_in_bash(scripts["bash"], [*path.split(), "-"])
        assert offered == list(node.options) and "--help" in offered, path


@pytest.mark.skipif(shutil.which("zsh") is None and not os.environ.get("CI"),
                    reason="zsh is not installed (CI installs it)")
def test_zsh_loads_the_script_and_completes_through_bashcompinit(scripts: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    program = (
        'autoload -U compinit && compinit -u -D; eval "$(<$1)"; '
        'print -r -- "$_comps[retcon-sandbox]"; '
        "emulate -L sh; setopt kshglob noshglob braceexpand; "  # as bashcompinit's compgen does
        'COMP_WORDS=(retcon-sandbox execute --repo x --sandbox ""); COMP_CWORD=5; '
        '_retcon_sandbox; print -r -- "${COMPREPLY[@]}"')
    proc = subprocess.run(["zsh", "-f", "-c", program, "zsh", str(scripts["zsh"])],
                          capture_output=True, text=True, env={"HOME": str(tmp_path)})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines() == ["_bash_complete -o default -F _retcon_sandbox",
                                        "docker local"]


def test_an_unknown_shell_is_a_usage_error() -> None:
    result = cli("completion", "tcsh")
    assert result.code == 2 and "invalid choice: 'tcsh'" in result.err


def test_the_image_names_completed_are_the_catalogs() -> None:
    from retcon_sandbox.backends.docker.sandboximages import CATALOG

    assert tuple(CATALOG) == cli_module.IMAGE_NAMES


needs_fish = pytest.mark.skipif(shutil.which("fish") is None and not os.environ.get("CI"),
                                reason="fish is not installed (CI installs it)")


def complete_in_fish(script: Path, line: str, home: Path) -> list[str]:
    """What fish offers for `line` (the cursor at its end), descriptions dropped."""
    proc = subprocess.run(["fish", "--no-config", "-c", "source $argv[1]; complete -C $argv[2]",
                           str(script), line], capture_output=True, text=True, cwd=home,
                          env={"HOME": str(home), "PATH": os.environ["PATH"]}, check=True)
    assert proc.stderr == ""
    return sorted(row.split("\t")[0] for row in proc.stdout.splitlines())


@needs_fish
@pytest.mark.parametrize(("line", "expected"), [
    ("retcon-sandbox ima", ["images"]),
    ("retcon-sandbox images b", ["bootstrap", "build"]),
    ("retcon-sandbox images build ", ["base", "node", "rust"]),
    ("retcon-sandbox images prune --e", ["--environments"]),
    ("retcon-sandbox execute --sandbox ", ["docker", "local"]),
    ("retcon-sandbox reconstruct --skip t", ["test"]),
    ("retcon-sandbox execute --repo images --no-c", ["--no-cache"]),
    ("retcon-sandbox completion ", ["bash", "fish", "zsh"]),
    ("retcon-sandbox execute sp", ["spec.toml"]),  # a SPEC: file names
    ("retcon-sandbox execute --repo sp", ["spec.toml"]),  # a value: likewise
    ("retcon-sandbox images spe", []),  # a command is expected, not a file
])
def test_fish_completes(scripts: dict[str, Path], tmp_path: Path, line: str,
                        expected: list[str]) -> None:
    (tmp_path / "spec.toml").write_text("")
    assert complete_in_fish(scripts["fish"], line, tmp_path) == expected


@needs_fish
def test_fish_offers_every_command_and_option(scripts: dict[str, Path], tmp_path: Path) -> None:
    tree = {node.path: node for node in nodes(cli_module.parser())}
    top = complete_in_fish(scripts["fish"], "retcon-sandbox ", tmp_path)
    assert top == sorted(tree[""].commands)
    for path, node in tree.items():
        offered = complete_in_fish(scripts["fish"], f"retcon-sandbox {path} -".replace("  ", " "),
                                   tmp_path)
        assert offered == sorted(node.options), path


def test_a_word_the_script_cannot_hold_safely_is_refused() -> None:
    """Words go into the script unquoted: anything but plain option-like text is refused."""
    parser = argparse.ArgumentParser(prog="retcon-sandbox")
    parser.add_argument("--mode", choices=("fast", "$(touch /tmp/x)"))
    with pytest.raises(ValueError, match="cannot write"):
        bash(parser, "retcon-sandbox")
