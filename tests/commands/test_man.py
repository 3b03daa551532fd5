"""`retcon-sandbox man`: the man page generated from the parsers, rendered by a real groff."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess

import pytest

from retcon_sandbox import cli as cli_module
from retcon_sandbox.commands.completion import nodes
from retcon_sandbox.commands.man import page, roff
from tests.conftest import cli

needs_groff = pytest.mark.skipif(shutil.which("groff") is None and not os.environ.get("CI"),
                                 reason="groff is not installed (CI installs it)")


def render(text: str) -> tuple[str, str]:
    """The page as groff shows it, on one line (its dashes and minus signs as `-`), and what
    groff warned of."""
    proc = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-P-cbou"], input=text,
                          capture_output=True, text=True, check=True)
    shown = proc.stdout.replace("\u2010", "-").replace("\u2212", "-").replace("\u2019", "'")
    return " ".join(shown.split()), proc.stderr


@needs_groff
def test_the_page_names_every_command_and_option_and_groff_warns_of_nothing() -> None:
    result = cli("man")
    assert result.code == 0, result.err
    assert result.out.startswith('.TH "RETCON\\-SANDBOX" 1 ')
    shown, warnings = render(result.out)
    assert warnings == ""
    text = shown
    for node in nodes(cli_module.parser()):
        if node.path:
            assert f"retcon-sandbox {node.path} " in text, node.path
        for option in node.options:
            assert option in text, (node.path, option)
    assert "EXIT STATUS" in text and "130 interrupted" in text
    assert "OPENAI_BASE_URL" in text


def test_text_that_looks_like_a_request_stays_text() -> None:
    assert roff(".so /etc/passwd") == "\\&.so /etc/passwd"
    assert roff("'br") == "\\&'br"
    assert roff("a\\fBb --x") == "a\\efBb \\-\\-x"


@needs_groff
def test_a_help_text_with_roff_syntax_is_shown_as_written() -> None:
    parser = argparse.ArgumentParser(prog="tool", description="Do things.")
    sub = parser.add_subparsers()
    child = sub.add_parser("run", description=".TH x\n'so y")
    child.add_argument("--mode", help="\\fBbold\\fR -- 100%% .sh")  # argparse: %% is %
    shown, warnings = render(page(parser))
    assert warnings == ""
    text = shown
    assert ".TH x 'so y" in text and "\\fBbold\\fR -- 100% .sh" in text
