"""A branch whose file names are not UTF-8 (`latin\\xe9.txt`, bytes as git keeps them): every
message the tool composes from such a name (a commit's message, a stop's summary, an error, the
terminal's lines) and every `--json` event holds it as `latin\\xe9.txt`, a backslash and the
byte in hex, as the terminal shows it and the model is shown it: valid UTF-8, and no lone
surrogate, which strict JSON parsers refuse. Never an internal error, on the first run or a
rerun."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from retcon_sandbox.model.tools import named
from retcon_sandbox.report import json_text
from retcon_sandbox.spec.file import CommitSpec
from retcon_sandbox.spec.owed import still_owed
from tests.conftest import cli, git, llm_env
from tests.fake_openai import FakeOpenAI, call

pytestmark = pytest.mark.slow  # whole runs of the command line

LOCAL = ("--sandbox", "local", "--non-interactive")
LATIN = b"latin\xe9.txt"  # taken by commit 2's glob
ODD = b"odd\xff/n\xfe.bin"  # claimed by no commit: the remainder's
SHOWN = {LATIN: "latin\\xe9.txt", ODD: "odd\\xff/n\\xfe.bin"}

SPEC = """\
source = "feature"
remote = "main"
cleaned = "feature-clean"

[sandbox]
test = "true"
{extra}
[[commit]]
message = "one"
paths = ["a.txt"]

[[commit]]
message = "two"
paths = ["latin?.txt"]
"""


def make_repo(root: Path, extra: str = "", odd_size: int = 128) -> Path:
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("r\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    git(root, "checkout", "-q", "-b", "feature")
    (root / "a.txt").write_text("a\n")
    base = os.fsencode(root)
    with open(os.path.join(base, LATIN), "wb") as handle:
        handle.write(b"latin\n")
    os.makedirs(os.path.join(base, b"odd\xff"))
    with open(os.path.join(base, ODD), "wb") as handle:
        handle.write(b"\x00\x01" * (odd_size // 2))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "wip")
    git(root, "checkout", "-q", "main")
    spec = root / "history-spec.toml"
    spec.write_text(SPEC.format(extra=extra))
    return spec


def strict(out: str) -> list[dict[str, Any]]:
    """Each line of --json, as a strict parser takes it: UTF-8, no surrogate escape, no lone
    surrogate once read."""
    events = []
    for line in out.splitlines():
        line.encode("utf-8")  # no lone surrogate in the text itself
        assert not re.search(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}", line), line
        event = json.loads(line)
        _no_surrogate(event)
        events.append(event)
    assert events
    return events


def _no_surrogate(value: Any) -> None:
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, list):
        for item in value:
            _no_surrogate(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_surrogate(key)
            _no_surrogate(item)


def test_execute_verify_and_status_name_such_files_in_valid_utf8(tmp_path: Path) -> None:
    spec = make_repo(tmp_path / "repo")
    repo = spec.parent
    result = cli("execute", str(spec), *LOCAL, "--json")
    assert result.code == 0, result.out + result.err
    found = strict(result.out)
    assert "internal error" not in result.out + result.err
    taken = next(e for e in found if e["event"] == "taking_paths" and e["number"] == 2)
    assert taken["paths"] == [SHOWN[LATIN]]
    for kind in ("remainder", "leftover_commit", "leftover"):
        assert next(e for e in found if e["event"] == kind)["paths"] == [SHOWN[ODD]]
    assert git(repo, "rev-parse", "feature-clean^{tree}") == git(repo, "rev-parse",
                                                                 "feature^{tree}")
    message = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%B",
                              "feature-clean"], capture_output=True, check=True).stdout
    assert f"  {SHOWN[ODD]}\n".encode() in message  # the remainder's commit lists it
    message.decode("utf-8")  # a commit message is UTF-8
    spec.read_text(encoding="utf-8")

    again = cli("execute", str(spec), *LOCAL, "--json")  # a rerun: nothing left to do
    assert again.code == 0, again.out + again.err
    strict(again.out)

    verified = cli("verify", "main..feature-clean", "--test", "true", "--sandbox", "local",
                   "--json", cwd=repo)
    assert verified.code == 0, verified.out + verified.err
    strict(verified.out)

    odd_spec = repo / os.fsdecode(b"spec\xe9.toml")
    shutil.copyfile(spec, odd_spec)
    status = cli("status", str(odd_spec), "--json")
    assert status.code == 0, status.out + status.err
    [shown] = strict(status.out)
    assert shown["spec"].endswith("spec\\xe9.toml")


def test_the_terminal_lines_name_such_files_as_the_json_does(tmp_path: Path) -> None:
    spec = make_repo(tmp_path / "repo")
    result = cli("execute", str(spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert "internal error" not in result.err
    assert f"Taking paths from source: {SHOWN[LATIN]}" in result.out
    assert SHOWN[ODD] in result.out
    (result.out + result.err).encode("utf-8")


def test_an_error_about_such_a_file_is_valid_json(tmp_path: Path) -> None:
    """A file over [sandbox] max_file_size is refused before anything is written, by name."""
    spec = make_repo(tmp_path / "repo", 'max_file_size = "1k"\n', odd_size=4096)
    result = cli("execute", str(spec), *LOCAL, "--json")
    assert result.code == 1, result.out + result.err
    error = strict(result.out)[-1]
    assert error["event"] == "error" and error["kind"] != "internal", error
    assert SHOWN[ODD] in error["message"], error


def test_the_model_is_shown_such_names_and_may_use_them(tmp_path: Path) -> None:
    """Without `paths`, the model takes commit 2's file by the name it was shown, and assigns
    the remainder's file to commit 1 by that name too (a `fixup!` of it)."""
    spec = make_repo(tmp_path / "repo")
    spec.write_text(spec.read_text().replace('paths = ["latin?.txt"]',
                                             'hints = "the latin file"'))
    with FakeOpenAI([], respond=answers) as model:
        result = cli("execute", str(spec), *LOCAL, "--json", env=llm_env(model.base_url))
        asked = [str(b["messages"][1]["content"]) for b in model.requests]
        results = model.tool_results()
    assert result.code == 0, result.out + result.err
    found = strict(result.out)
    assert [e["paths"] for e in found if e["event"] == "remainder_commit"] == [[SHOWN[ODD]]]
    assert any(SHOWN[ODD] in task for task in asked)  # the remainder's, as the model saw it
    assert any("+latin" in r for r in results), results  # the diff of the name it was shown
    repo = spec.parent
    assert git(repo, "rev-parse", "feature-clean^{tree}") == git(repo, "rev-parse",
                                                                 "feature^{tree}")
    subjects = git(repo, "log", "--format=%s", "main..feature-clean").splitlines()
    assert subjects == ["fixup! one", "two", "one"]


def answers(body: dict[str, Any]) -> Any:
    task = str(body["messages"][1]["content"])
    if task.startswith("Commit 2 of"):
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        if turn == 0:
            return [call("read_diff", path=SHOWN[LATIN])]
        return [call("write_file", path=SHOWN[LATIN], content="latin\n"),
                call("create_commit", message="two")]
    if task.startswith("Commit 1 of"):
        return [call("write_file", path="a.txt", content="a\n"),
                call("create_commit", message="one")]
    if "assign_path" in json.dumps(body.get("tools")):
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        if turn == 0:
            return [call("assign_path", path=SHOWN[ODD], commit=1)]
        return [call("finish_assignment")]
    return [call("report_stuck", summary="unexpected request")]


def test_json_text_writes_each_byte_that_is_not_utf8_as_its_hex() -> None:
    name = os.fsdecode(b"caf\xe9")
    line = json_text({"paths": [name], name: Path(name), "note": "\ud800 \u00e9 \n"})
    assert line == ('{"paths": ["caf\\\\xe9"], "caf\\\\xe9": "caf\\\\xe9", '
                    '"note": "\\\\ud800 \u00e9 \\n"}')
    assert json.loads(line)["paths"] == ["caf\\xe9"]
    line.encode("utf-8")


def test_a_stop_names_such_a_file_as_the_terminal_does() -> None:
    hinted = CommitSpec(1, "one", "", ("*.txt",), ())
    owed = still_owed(hinted, (hinted,), [os.fsdecode(LATIN)])
    assert owed is not None and f"but {SHOWN[LATIN]}, named by" in owed.summary()
    assert named(SHOWN[ODD], {os.fsdecode(ODD)}) == os.fsdecode(ODD)
    assert named("other", {os.fsdecode(ODD)}) == "other"
