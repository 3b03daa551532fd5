"""`verify` for CI: the JUnit XML report, GitHub annotations, and the --json schema version;
the real CLI on real repositories with the local backend."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from retcon_sandbox.verify.cache import Outcome, Stage
from retcon_sandbox.verify.ci import (
    Location,
    escape_data,
    escape_property,
    github_annotations,
    junit,
    locate,
    xml_text,
)
from retcon_sandbox.verify.table import Row
from tests.conftest import Demo, cli, git

LOCAL = ("--sandbox", "local")
COMPILE = ("--build", "python3 -m compileall -q shop tests")
# What a hostile repository prints and names its commits: markup, a CDATA end, terminal and
# XML-illegal controls, workflow commands of its own, and bytes that are not UTF-8.
HOSTILE = (b"</failure><testcase name='fake'/> ]]> &amp; \x00\x01\x08\x0b\x0c\x1b]52;c;eA==\x07 "
           b"\xef\xbf\xbe \xff\xfe 100% done\r\n::add-mask::secret\n::error title=fake::forged\n")


def hostile_commit(demo: Demo) -> str:
    """A commit on feature whose build prints HOSTILE and fails; returns its subject."""
    demo.git("checkout", "-q", "feature")
    (demo.path / "boom.bin").write_bytes(HOSTILE)
    demo.git("add", "boom.bin")
    subject = "boom <b>&\x1b[31m ]]> \"q\" 'a':b,c %25"
    subprocess.run(["git", "-C", str(demo.path), "commit", "-q", "-m", subject], check=True)
    demo.git("checkout", "-q", "main")
    return subject


BOOM_BUILD = ("--build", "if [ -f boom.bin ]; then cat boom.bin; exit 1; fi")


def failing(number: int, tail: str, subject: str = "wip") -> Row:
    stage = Stage("build", "make", "FAIL (exit 1)", False, False, 0.25)
    return Row(number, str(number) * 40, "0" * 40, subject,
               outcome=Outcome((stage,), "Build FAIL (exit 1)\nmore", tail, 600.0))


def passing(number: int) -> Row:
    stage = Stage("build", "make", "PASS", True, False, 0.5)
    return Row(number, str(number) * 40, "0" * 40, "fine",
               outcome=Outcome((stage,), None, "", 600.0, cached=True))


# --- the pure parts --------------------------------------------------------------------------


def test_workflow_command_escaping() -> None:
    assert escape_data("50% a\r\nb::c,d") == "50%25 a%0D%0Ab::c,d"
    assert escape_property("50% a\r\nb::c,d") == "50%25 a%0D%0Ab%3A%3Ac%2Cd"
    # % first: an already-escaped sequence in the input is not decoded on the other side
    assert escape_data("%0A") == "%250A"


def test_an_annotation_is_one_line_whatever_the_output_holds() -> None:
    lines = github_annotations([passing(1), failing(2, "x\n::add-mask::s\r\n\x1b[2J%0A", "a:b,c")])
    assert len(lines) == 1
    (line,) = lines
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    title, message = re.fullmatch(r"::error title=([^:]*)::(.*)", line).groups()  # type: ignore[union-attr]
    assert title == "#2 2222222 a%3Ab%2Cc%3A Build FAIL (exit 1)"
    assert message == "x%0A::add-mask::s\\r%0A\\e[2J%250A"


TREE = {"shop/cart.py", "shop/discounts.py", "tests/test_discounts.py", "src/main.rs",
        "test/cart.test.js", "a,b:c%.py", "odd\x1bname.py"}
PYTEST = """\
    def test_summer_code():
>       assert discounted_total(cart, "SUMMER25") == 75

tests/test_discounts.py:12:
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _

>       return total * (100 - CODES[code]) / 100
E       KeyError: 'SUMMER25'

shop/discounts.py:13: KeyError
FAILED tests/test_discounts.py::test_summer_code - KeyError: 'SUMMER25'
"""
CARGO = """\
error[E0308]: mismatched types
 --> src/main.rs:3:5
  |
3 |     "x"
"""
NODE = """\
TypeError: cart.total is not a function
    at total (/workspace/node_modules/lib/index.js:10:3)
    at Object.<anonymous> (/workspace/test/cart.test.js:5:11)
    at Module._compile (node:internal/modules/cjs/loader:1105:14)
"""


@pytest.mark.parametrize(("output", "expected"), [
    (PYTEST, Location("tests/test_discounts.py", 12)),
    (PYTEST.replace("tests/test_discounts.py:12:", ""), Location("shop/discounts.py", 13)),
    ('  File "shop/cart.py", line 10\n    def add(self)\nSyntaxError: expected \':\'',
     Location("shop/cart.py", 10)),
    ('  File "/workspace/shop/cart.py", line 7, in add', Location("shop/cart.py", 7)),
    (CARGO, Location("src/main.rs", 3, 5)),
    (NODE, Location("test/cart.test.js", 5, 11)),  # node_modules/ is not in the tree
    ("./shop/cart.py:4:1: E302 expected 2 blank lines", Location("shop/cart.py", 4, 1)),
    ("a,b:c%.py:2: oops", Location("a,b:c%.py", 2)),
])
def test_a_failure_is_located_at_the_first_file_of_the_tree_it_names(
        output: str, expected: Location) -> None:
    assert locate(output, TREE) == expected


@pytest.mark.parametrize("output", [
    "/etc/passwd:1: root",  # absolute, outside the sandbox's workspace
    '  File "/usr/lib/python3.11/json/decoder.py", line 355, in raw_decode',
    "../shop/cart.py:3: climbs out",
    "/workspace/../etc/shadow:1: x",
    "shop/../../etc/passwd:1: x",
    "shop/missing.py:3: not in the tree",
    "shop/cart.py:0: no line 0",
    "odd\x1bname.py:3: a name that does not print as itself",
    "FAILED tests/test_discounts.py::test_summer_code - no line",
])
def test_nothing_outside_the_tree_is_located(output: str) -> None:
    assert locate(output, TREE) is None


def test_an_annotation_points_at_the_file_with_its_name_escaped() -> None:
    row = failing(3, "tail")
    assert row.outcome is not None
    located = Row(3, row.sha, "1" * 40, "wip", outcome=Outcome(
        row.outcome.stages, "Build FAIL (exit 1)\na,b:c%.py:2:7: boom", "tail", 600.0))
    asked: list[str] = []

    def files(tree: str) -> set[str]:
        asked.append(tree)
        return TREE

    (line,) = github_annotations([passing(1), located], files)
    assert line.startswith("::error file=a%2Cb%3Ac%25.py,line=2,col=7,title=#3 ")
    assert asked == ["1" * 40]  # the failing commit's own tree, and only its
    (plain,) = github_annotations([failing(2, "shop/cart.py:3: x")], files)
    assert plain.startswith("::error title=#2 ")  # its failure text names no file


def test_junit_xml_parses_back_and_escapes_what_xml_cannot_hold() -> None:
    tail = HOSTILE.decode("utf-8", "surrogateescape") + "\ud800 \uffff"
    text = junit("main..feature <&>", [passing(1), failing(2, tail, "s\x00 <x>")], 1.5)
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]", text)
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == "testsuites" and root.get("failures") == "1" and root.get("tests") == "2"
    (suite,) = root
    assert suite.get("name") == "main..feature <&>"
    first, second = suite.findall("testcase")
    assert first.find("failure") is None and first.find("properties") is not None
    assert second.get("name") == "#2 222222222222 s\\x00 <x>"
    failure = second.find("failure")
    assert failure is not None and failure.get("type") == "build"
    assert failure.get("message") == "Build FAIL (exit 1)"
    assert failure.text == xml_text(tail)
    assert "</failure><testcase name='fake'/> ]]>" in failure.text
    assert "\\e]52;c;eA==\\x07" in failure.text and "\\ud800" in failure.text
    assert "\\ufffe" in failure.text and "\\xff\\xfe" in failure.text


# --- end to end ------------------------------------------------------------------------------


@pytest.mark.slow
def test_junit_has_one_case_per_commit_and_the_failing_tail(demo: Demo, tmp_path: Path) -> None:
    subject = hostile_commit(demo)
    report = tmp_path / "junit.xml"
    result = cli("verify", "main..feature", *BOOM_BUILD, "--junit", str(report), *LOCAL,
                 cwd=demo.path)
    assert result.code == 3, result.out + result.err
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "11" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert len(cases) == 11
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == 1
    assert failed[0].get("name") == xml_text(f"#11 {git(demo.path, 'rev-parse', 'feature')[:12]} "
                                             f"{subject}")
    failure = failed[0].find("failure")
    assert failure is not None and failure.text is not None
    assert "::add-mask::secret" in failure.text and "\\e]52;c;eA==\\x07" in failure.text


@pytest.mark.slow
def test_github_format_annotates_failures_and_reads_no_command_from_the_output(
        demo: Demo) -> None:
    hostile_commit(demo)
    result = cli("verify", "main..feature", *BOOM_BUILD, "--format", "github", *LOCAL,
                 cwd=demo.path)
    assert result.code == 3, result.out + result.err
    lines = result.out.splitlines()
    token = re.fullmatch(r"::stop-commands::([0-9a-f]{32})", lines[0])
    assert token, lines[0]
    resume = lines.index(f"::{token.group(1)}::")
    assert "11 commits: 10 passed, 1 failed" in "\n".join(lines[:resume])
    assert any("::add-mask::secret" in line for line in lines[:resume])  # shown, not obeyed
    after = lines[resume + 1:]
    assert len(after) == 1 and after[0].startswith("::error title=#11 ")
    assert "::add-mask::secret%0A::error title=fake::forged" in after[0]
    assert "\x1b" not in after[0]


@pytest.mark.slow
def test_github_annotations_point_at_the_failing_file_and_line(demo: Demo) -> None:
    """The demo's branch: a commit whose build fails on a syntax error, one whose test fails
    with a KeyError; each annotation names the file and line its output points at."""
    result = cli("verify", "main..feature", "--spec", str(demo.spec), "--format", "github",
                 *LOCAL, cwd=demo.path)
    assert result.code == 3, result.out + result.err
    errors = [line for line in result.out.splitlines() if line.startswith("::error ")]
    assert len(errors) == 2, result.out
    assert errors[0].startswith("::error file=shop/cart.py,line=10,title=#3 ")
    assert errors[1].startswith("::error file=tests/test_discounts.py,line=")


def test_github_format_with_nothing_failing_prints_no_annotation(demo: Demo) -> None:
    result = cli("verify", "main..feature~8", *COMPILE, "--format", "github", *LOCAL,
                 cwd=demo.path)
    assert result.code == 0, result.out + result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("::stop-commands::")
    assert lines[-1] == f"::{lines[0].rsplit('::', 1)[1]}::"
    assert not any(line.startswith("::error") for line in lines)


def test_ci_outputs_are_checked_before_anything_runs(demo: Demo, tmp_path: Path) -> None:
    both = cli("verify", "main..feature", *COMPILE, "--format", "github", "--json", *LOCAL,
               cwd=demo.path)
    assert both.code == 2 and "--format github and --json" in both.err
    nowhere = cli("verify", "main..feature", *COMPILE, "--junit",
                  str(tmp_path / "missing" / "j.xml"), *LOCAL, cwd=demo.path)
    assert nowhere.code == 2 and "not a file in an existing directory" in nowhere.err
    assert "Verifying" not in nowhere.out
    assert not (tmp_path / "missing").exists()


def test_every_json_event_carries_the_schema_version(demo: Demo, tmp_path: Path) -> None:
    report = tmp_path / "j.xml"
    result = cli("verify", "main..feature~8", *COMPILE, "--json", "--junit", str(report),
                 *LOCAL, cwd=demo.path)
    assert result.code == 0, result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    assert {e["event"] for e in events} >= {"verify_start", "commit_verified", "verify_summary"}
    assert all(e["schema"] == 1 for e in events)
    assert ET.parse(report).getroot().get("tests") == "2"
    error = cli("verify", "main..nothing", *COMPILE, "--json", *LOCAL, cwd=demo.path)
    assert error.code == 1
    assert [json.loads(line)["schema"] for line in error.out.splitlines()] == [1]
