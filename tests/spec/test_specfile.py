"""The spec file: run from anywhere, wherever the spec lives (a symlink included); every save keeps
CRLF line endings and a byte-order mark byte for byte; appends to a very large spec splice text
instead of re-serialising it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retcon_sandbox.errors import ConcurrentEditError, SpecError
from retcon_sandbox.spec.file import SpecFile, entry_toml, load
from retcon_sandbox.spec.history import (
    CommitCreated,
    Complete,
    Entry,
    NothingToExtract,
    Resolved,
    Response,
    Started,
    Stuck,
)
from tests.conftest import NEUTRAL, Demo, cli, make_demo
from tests.spec.test_spec import SHA, SPEC

LOCAL = ("--sandbox", "local", "--non-interactive")


def reconstructed(demo: Demo) -> bool:
    return demo.git("rev-parse", "feature-clean^{tree}") == demo.git("rev-parse", "feature^{tree}")


# --- where the spec is, where the repository is -------------------------------------------


@pytest.mark.slow
def test_run_inside_the_repository_with_the_spec_outside_it(demo: Demo, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    outside = demo.spec.rename(artifacts / "spec.toml")
    result = cli("execute", os.path.relpath(outside, demo.path / "shop"), *LOCAL,
                 cwd=demo.path / "shop")
    assert result.code == 0, result.out + result.err
    assert reconstructed(demo)
    assert load(outside).commits[-1].history[-1] == Complete()
    assert not (demo.path / "history-spec.toml").exists()
    status = cli("status", str(outside))
    assert status.code == 0 and "4/4 complete" in status.out


@pytest.mark.slow
def test_repo_option_chooses_the_repository(demo: Demo, tmp_path: Path) -> None:
    outside = demo.spec.rename(tmp_path / "spec.toml")
    lost = cli("execute", str(outside), *LOCAL)  # from a directory outside any repository
    assert lost.code == 1 and "no git repository here, nor where the spec is" in lost.err
    assert "--repo DIR" in lost.err
    result = cli("execute", str(outside), *LOCAL, "--repo", str(demo.path))
    assert result.code == 0, result.out + result.err
    assert reconstructed(demo)


@pytest.mark.slow
def test_the_repository_of_the_current_directory_wins_over_the_specs(tmp_path: Path) -> None:
    one = make_demo(tmp_path / "one", with_paths=True)
    two = make_demo(tmp_path / "two", with_paths=True)
    result = cli("execute", str(one.spec), *LOCAL, cwd=two.path)
    assert result.code == 0, result.out + result.err
    assert reconstructed(two) and "feature-clean" not in one.git("branch", "--list")


@pytest.mark.slow
def test_a_symlinked_spec_writes_the_target_and_stays_a_link(demo: Demo, tmp_path: Path) -> None:
    link = tmp_path / "link-to-spec.toml"
    link.symlink_to(demo.spec)
    result = cli("execute", str(link), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert link.is_symlink() and os.readlink(link) == str(demo.spec)
    assert load(demo.spec).commits[-1].history[-1] == Complete()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link-to-spec.toml", "repo"]
    assert reconstructed(demo)


@pytest.mark.slow
def test_a_relative_symlink_in_another_directory(demo: Demo, tmp_path: Path) -> None:
    ci = tmp_path / "ci"
    ci.mkdir()
    (ci / "spec.toml").symlink_to(os.path.relpath(demo.spec, ci))
    result = cli("execute", "spec.toml", *LOCAL, cwd=ci)  # the repository: the target's
    assert result.code == 0, result.out + result.err
    assert (ci / "spec.toml").is_symlink() and reconstructed(demo)


# --- byte for byte --------------------------------------------------------------------------

BOM = "\ufeff"


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def appended(path: Path, number: int, entries: list[Entry]) -> None:
    specfile = SpecFile(path)
    commit = specfile.load().commits[number - 1]
    for entry in entries:
        _, commit = specfile.append(commit, entry)


LAYOUTS = [  # (the commit table's tail, as written by a person)
    'paths = ["src/validation.py"]\n',
    'paths = ["src/validation.py"]   # a comment\n',
    'paths = ["src/validation.py"]\nhistory = ["started"]\n',
    'paths = ["src/validation.py"]\nhistory = [\n  "started",  # first\n]\n',
    'paths = ["src/validation.py"]\nhistory = [ ]\n',
    'paths = ["src/validation.py"]\nhistory = [\n    "started"\n]\n',
]


@pytest.mark.parametrize("tail", LAYOUTS)
@pytest.mark.parametrize(("bom", "newline"), [("", "\n"), (BOM, "\n"), ("", "\r\n"),
                                              (BOM, "\r\n")])
def test_every_save_keeps_line_endings_and_the_bom(tmp_path: Path, tail: str, bom: str,
                                                   newline: str) -> None:
    """The same appends to the same spec, written with LF or CRLF, with or without a BOM: the
    results differ exactly by those bytes."""
    lf_text = SPEC.replace('paths = ["src/validation.py"]\n', tail)
    entries: list[Entry] = [CommitCreated(SHA), Stuck('needs "x"\r\nand y'), Complete()]
    reference = tmp_path / "lf.toml"
    reference.write_bytes(lf_text.encode())
    if "started" not in tail:
        entries.insert(0, Started())
    appended(reference, 1, entries)
    path = tmp_path / "spec.toml"
    path.write_bytes((bom + lf_text.replace("\n", newline)).encode())
    appended(path, 1, entries)
    expected = bom + reference.read_bytes().decode().replace("\n", newline)
    assert path.read_bytes() == expected.encode()
    assert load(path).commits[0].history[-3:] == tuple(entries[-3:])


@pytest.mark.slow
def test_a_whole_run_keeps_crlf_and_the_bom(tmp_path: Path) -> None:
    """Two identical repositories, one spec with LF, one with CRLF and a BOM: after the whole
    reconstruction the two files differ only by those bytes."""
    lf = make_demo(tmp_path / "lf", with_paths=True)
    windows = make_demo(tmp_path / "crlf", with_paths=True)
    windows.spec.write_bytes((BOM + crlf(lf.spec.read_text())).encode())
    for demo in (lf, windows):
        result = cli("execute", str(demo.spec), *LOCAL)
        assert result.code == 0, result.out + result.err
    assert lf.git("rev-parse", "feature-clean") == windows.git("rev-parse", "feature-clean")
    assert lf.spec.read_text().count("commit_created") == 4
    assert windows.spec.read_bytes() == (BOM + crlf(lf.spec.read_text())).encode()


def test_a_spec_with_lone_carriage_returns_in_strings_is_kept(tmp_path: Path) -> None:
    text = SPEC.replace('build = "make"', 'build = "make\\r all"')  # none in messages or hints
    path = tmp_path / "spec.toml"
    path.write_bytes(crlf(text).encode())
    appended(path, 1, [Started()])
    assert path.read_bytes().count(b"\r\n") == crlf(text).count("\r\n") + 3
    assert b"\n" not in path.read_bytes().replace(b"\r\n", b"")


@pytest.mark.parametrize("entry", [
    Stuck("can't \ud800 do it"),  # a model's unpaired JSON escape
    NothingToExtract("all done \ud83d"),  # half of an emoji's pair
    Resolved("caf\udce9"),  # a byte a Latin-1 terminal sent (surrogateescape)
])
def test_text_that_is_not_unicode_is_saved_with_replacement_characters(tmp_path: Path,
                                                                       entry: Entry) -> None:
    """TOML (and UTF-8) cannot hold a lone surrogate: it is written U+FFFD, and the commit the
    append returns holds what the file holds."""
    path = tmp_path / "spec.toml"
    path.write_text(SPEC)
    specfile = SpecFile(path)
    commit = specfile.load().commits[0]
    before: list[Entry] = [Started(), Stuck("help")] if isinstance(entry, Resolved) \
        else [Started()]
    for earlier in before:
        _, commit = specfile.append(commit, earlier)
    _, commit = specfile.append(commit, entry)
    saved = load(path).commits[0].history[-1]
    assert saved == commit.history[-1] and "\ufffd" in str(saved)
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in str(saved))
    assert "\ufffd" in entry_toml(entry)  # the hint that shows an entry never fails either


UNAPPENDABLE = [  # histories tomllib reads, written where or how the splice cannot append
    'paths = ["src/validation.py"]\n\n[[commit.history]]\nresponse = "keep going"\n',
    'paths = ["src/validation.py"]\n"hist\\u006Fry" = [{ response = "go" }]\n',
]
APPENDABLE = [
    'paths = ["src/validation.py"]\n"history" = [{ response = "go" }]\n',
    "paths = [\"src/validation.py\"]\n'history' = []\n",
]


@pytest.mark.parametrize("tail", UNAPPENDABLE)
def test_a_history_the_splice_cannot_append_to_is_refused_before_any_write(
        tmp_path: Path, tail: str) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.replace('paths = ["src/validation.py"]\n', tail))
    before = path.read_bytes()
    specfile = SpecFile(path)
    commit = specfile.load().commits[0]
    assert commit.history == (Response("keep going" if "keep" in tail else "go"),)
    with pytest.raises(SpecError, match=r"#1 .*cannot append to its history as written"):
        specfile.check_appendable()
    with pytest.raises(ConcurrentEditError, match="cannot be appended to as written"):
        specfile.append(commit, Started())  # as a run would, had the file changed under it
    assert path.read_bytes() == before


@pytest.mark.parametrize("tail", APPENDABLE)
def test_a_quoted_history_key_is_appended_to(tmp_path: Path, tail: str) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.replace('paths = ["src/validation.py"]\n', tail))
    specfile = SpecFile(path)
    specfile.check_appendable()
    appended(path, 1, [Started()])
    assert load(path).commits[0].history[-1] == Started()


# --- large specs ----------------------------------------------------------------------------


def large_spec(commits: int, extra: dict[int, str] | None = None) -> str:
    """A spec of many finished commits, with long hints; `extra` adds an entry to a commit."""
    parts = ['# thousands of commits\nsource = "feature"\nremote = "main"\n'
             'cleaned = "feature-clean"\n']
    hints = "Move the helpers of this module and their callers; keep the tests for later. " * 12
    for n in range(1, commits + 1):
        sha = f"{n:040x}"
        more = extra.get(n, "") if extra else ""
        finished = n < commits - 1
        parts.append(f'\n[[commit]]\nmessage = """feat: step {n}\n\nBody of step {n}."""\n'
                     f'hints = """{hints}"""\nhistory = [\n    "started",\n'
                     + (f'    {{ commit_created = "{sha}" }},\n    "complete",\n' if finished
                        else "")
                     + more + "]\n")
    return "".join(parts)


def test_appending_to_a_large_spec_splices_the_right_table(tmp_path: Path) -> None:
    commits = 2_000
    path = tmp_path / "spec.toml"
    path.write_text(large_spec(commits))
    assert path.stat().st_size > 2_000_000
    specfile = SpecFile(path)
    spec = specfile.load()
    last, second_last = spec.commits[-1], spec.commits[-2]
    created = CommitCreated("f" * 40)
    spec, second_last = specfile.append(second_last, created)
    spec, last = specfile.append(last, Stuck("cannot\nsplit"))
    specfile.append(second_last, Complete())
    expected = large_spec(commits, {
        commits - 1: f"    {entry_toml(created)},\n    {entry_toml(Complete())},\n",
        commits: f"    {entry_toml(Stuck('cannot' + chr(10) + 'split'))},\n"})
    assert path.read_text() == expected
    again = load(path)
    assert len(again.commits) == commits
    assert again.commits[-1].history == (Started(), Stuck("cannot\nsplit"))


def test_an_edit_far_from_the_appended_table_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(large_spec(500))
    specfile = SpecFile(path)
    last = specfile.load().commits[-1]
    _, last = specfile.append(last, CommitCreated("e" * 40))
    path.write_text(path.read_text().replace("feat: step 3\n", "feat: step three\n"))
    specfile.append(last, Complete())
    text = path.read_text()
    assert "feat: step three\n" in text and load(path).commits[-1].history[-1] == Complete()


@pytest.mark.slow
def test_a_spec_with_a_name_of_250_bytes_is_run_and_saved(demo: Demo) -> None:
    """The temporary file a save makes beside it, and the run's lock and transcript, have names
    that fit (255 bytes) however long the spec's own."""
    spec = demo.spec.rename(demo.path / ("s" * 245 + ".toml"))
    result = cli("execute", str(spec), *LOCAL)
    assert result.code == 0, result.out + result.err
    assert reconstructed(demo) and load(spec).commits[-1].history[-1] == Complete()
    state = Path(demo.git("rev-parse", "--absolute-git-dir")) / "retcon-sandbox"
    assert all(len(name) <= 255 for name in os.listdir(state))
    assert not [name for name in os.listdir(demo.path) if name.endswith(".tmp")]


def test_cli_reads_specs_relative_to_the_current_directory(demo: Demo) -> None:
    result = cli("status", "history-spec.toml", cwd=demo.path)
    assert result.code == 0 and "0/4 complete" in result.out
    assert cli("status", "history-spec.toml", cwd=NEUTRAL).code == 1


def test_prompt_documents_where_the_spec_and_repository_are() -> None:
    guide = cli("prompt").out
    assert "the one that contains the current directory" in guide and "--repo DIR" in guide
    assert "symlink" in guide and "byte-order mark" in guide
    assert "`docs/**`" in guide and "`src/**/test_*.py`" in guide and "nothing_to_extract" in guide
