"""The spec file: clear errors with key paths, comments kept byte for byte, atomic merged saves."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from retcon_sandbox.errors import ConcurrentEditError, LockedError, SpecError
from retcon_sandbox.spec.file import SpecFile, load
from retcon_sandbox.spec.history import CommitCreated, Complete, Started, Stuck
from tests.conftest import cli

SPEC = '''# My reconstruction plan
source = "feature-oauth"          # the messy branch
remote = "origin/main"            # what it will merge into
cleaned = "feature-oauth-clean"

[sandbox]   # optional
build = "make"

[[commit]]
message = """refactor: extract validation

Why this commit exists."""
hints = "Move validate_user."   # keep it small
paths = ["src/validation.py"]

# the feature itself
[[commit]]
message = "feat: oauth"
hints = """Multi-line
hints."""
'''

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC)
    return path


def test_load_gives_typed_values(spec_path: Path) -> None:
    spec = load(spec_path)
    assert (spec.source, spec.remote, spec.cleaned) == ("feature-oauth", "origin/main",
                                                        "feature-oauth-clean")
    assert spec.sandbox.build == "make" and spec.sandbox.test is None
    assert spec.commits[0].message == "refactor: extract validation\n\nWhy this commit exists."
    assert spec.commits[0].paths == ("src/validation.py",)
    assert spec.commits[1].paths is None and spec.commits[1].history == ()
    assert spec.commits[0].versions == ()
    spec_path.write_text(SPEC.replace('paths = ["src/validation.py"]',
                                      f'paths = ["a.py"]\nversions = {{ "src/b.py" = "{SHA}" }}'))
    assert load(spec_path).commits[0].versions == (("src/b.py", SHA),)


@pytest.mark.parametrize(("edit", "message"), [
    (('paths = ["src/validation.py"]', 'paths = ["a.py", 3]'),
     "spec.toml: [[commit]] #1 → paths[1]: expected a path or pattern"),
    (('paths = ["src/validation.py"]', 'paths = ["../etc/passwd"]'),
     "spec.toml: [[commit]] #1 → paths[0]: `..` is refused"),
    (('message = "feat: oauth"', 'message = 7'),
     "spec.toml: [[commit]] #2 → message: expected a string"),
    (('remote = "origin/main"', ''), "spec.toml: remote: missing (expected a string)"),
    (('build = "make"', 'build = "make"\nnetwork = "bridge"'),
     'spec.toml: [sandbox] → network: expected "none"'),
    (('build = "make"', 'bogus = 1'), "spec.toml: [sandbox] → bogus: unknown key"),
    (('hints = "Move validate_user."', 'history = ["complete", { commit_created = "abc" }]'),
     "spec.toml: [[commit]] #1 → history[1] → commit_created: expected a full 40-hex commit sha"),
    (('hints = "Move validate_user."', 'history = ["done"]'),
     "spec.toml: [[commit]] #1 → history[0]: unknown entry 'done'"),
    (('cleaned = "feature-oauth-clean"', 'cleaned = "feature-oauth"'),
     "spec.toml: cleaned: must differ from `source`"),
    (('source = "feature-oauth"', 'source = "feature-oauth'),
     "spec.toml: not valid TOML: Illegal character '\\n' (at line 2"),
    (('paths = ["src/validation.py"]', f'paths = ["a.py"]\nversions = {{ "b.py" = "{SHA[:12]}" }}'),
     "spec.toml: [[commit]] #1 → versions → 'b.py': expected a full commit id"),
    (('paths = ["src/validation.py"]', f'paths = ["a.py"]\nversions = {{ "../b.py" = "{SHA}" }}'),
     "spec.toml: [[commit]] #1 → versions → '../b.py': `..` is refused"),
    (('paths = ["src/validation.py"]', 'paths = ["a.py"]\nversions = ["b.py"]'),
     "spec.toml: [[commit]] #1 → versions: expected a table of paths and commit ids"),
    (('hints = """Multi-line', f'versions = {{ "b.py" = "{SHA}" }}\nhints = """Multi-line'),
     "spec.toml: [[commit]] #2 → versions: needs `paths` beside it"),
])
def test_errors_name_the_key_path(spec_path: Path, edit: tuple[str, str], message: str) -> None:
    spec_path.write_text(SPEC.replace(*edit))
    with pytest.raises(SpecError) as info:
        load(spec_path)
    assert info.value.message.startswith(message), info.value.message


def test_appends_keep_everything_else_byte_for_byte(spec_path: Path) -> None:
    specfile = SpecFile(spec_path)
    spec = specfile.load()
    _, first = specfile.append(spec.commits[0], Started())
    _, first = specfile.append(first, CommitCreated(SHA))
    _, first = specfile.append(first, Complete())
    text = spec_path.read_text()
    expected_history = (f'history = [\n    "started",\n    {{ commit_created = "{SHA}" }},\n'
                        '    "complete",\n]\n')
    assert text == SPEC.replace('paths = ["src/validation.py"]\n',
                                'paths = ["src/validation.py"]\n' + expected_history)
    assert load(spec_path).commits[0].history == (Started(), CommitCreated(SHA), Complete())


def test_a_users_edit_during_the_run_is_kept(spec_path: Path) -> None:
    specfile = SpecFile(spec_path)
    spec = specfile.load()
    _, first = specfile.append(spec.commits[0], Started())
    edited = spec_path.read_text().replace('"Move validate_user."', '"Move it, and its test."')
    spec_path.write_text(edited + "\n# a note the user added\n")
    specfile.append(first, Stuck('needs "the helper"\nfrom commit 2'))
    text = spec_path.read_text()
    assert '"Move it, and its test."' in text and "# a note the user added" in text
    assert load(spec_path).commits[0].history[-1] == Stuck('needs "the helper"\nfrom commit 2')


def test_an_edit_that_removes_the_commit_stops_without_writing(spec_path: Path) -> None:
    specfile = SpecFile(spec_path)
    spec = specfile.load()
    _, first = specfile.append(spec.commits[0], Started())
    rewritten = spec_path.read_text().replace("refactor: extract validation", "refactor: other")
    spec_path.write_text(rewritten)
    with pytest.raises(ConcurrentEditError) as info:
        specfile.append(first, CommitCreated(SHA))
    assert "your edit is kept" in info.value.message
    assert "commit_created" in info.value.hint
    assert spec_path.read_text() == rewritten


def test_saves_leave_no_temporary_files(spec_path: Path) -> None:
    specfile = SpecFile(spec_path)
    specfile.append(specfile.load().commits[1], Started())
    assert sorted(p.name for p in spec_path.parent.iterdir()) == ["spec.toml"]


def _hold_lock(path: str, ready: multiprocessing.synchronize.Event,
               release: multiprocessing.synchronize.Event) -> None:
    with SpecFile(Path(path)).locked(Path(path).with_name("spec.lock")):
        ready.set()
        release.wait(10)


def test_a_second_run_on_the_same_spec_is_refused(spec_path: Path) -> None:
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    other = multiprocessing.Process(target=_hold_lock, args=(str(spec_path), ready, release))
    other.start()
    try:
        assert ready.wait(10)
        with pytest.raises(LockedError) as info, \
                SpecFile(spec_path).locked(spec_path.with_name("spec.lock")):
            pass
        assert f"pid {other.pid}" in info.value.message
    finally:
        release.set()
        other.join()
    with SpecFile(spec_path).locked(spec_path.with_name("spec.lock")):  # free again
        pass


@pytest.mark.parametrize(("edit", "message"), [
    (('message = "feat: oauth"', 'message = "feat: oauth\\u001b]0;pwned\\u0007"'),
     "spec.toml: [[commit]] #2 → message: control character U+001B in the subject (first "
     "line), column 12"),
    (('message = "feat: oauth"', 'message = "feat:\\toauth"'),
     "spec.toml: [[commit]] #2 → message: control character U+0009 in the subject"),
    (('message = "feat: oauth"', 'message = "feat: oauth\\r"'),
     "spec.toml: [[commit]] #2 → message: control character U+000D in the subject"),
    (('Why this commit exists."""', 'Why this \\u009b31m commit exists."""'),
     "spec.toml: [[commit]] #1 → message: control character U+009B in line 3, column 10"),
    (('Why this commit exists."""', 'Why this \\u007f commit exists."""'),
     "spec.toml: [[commit]] #1 → message: control character U+007F in line 3"),
    (('hints = "Move validate_user."', 'hints = "Move\\u0000validate_user."'),
     "spec.toml: [[commit]] #1 → hints: control character U+0000 in line 1, column 5"),
    (('hints = """Multi-line', 'hints = """Multi-line\\u0085'),
     "spec.toml: [[commit]] #2 → hints: control character U+0085 in line 1"),
    (('hints = """Multi-line', 'hints = """Multi-line\\r'),
     "spec.toml: [[commit]] #2 → hints: control character U+000D in line 1"),
])
def test_control_characters_in_messages_and_hints_are_refused(
        spec_path: Path, edit: tuple[str, str], message: str) -> None:
    """A message or hint reaches the commit, the terminal and the model: no escape sequence,
    carriage return or other control character may ride in. Bodies keep newlines and tabs."""
    assert edit[0] in SPEC
    spec_path.write_text(SPEC.replace(*edit))
    with pytest.raises(SpecError) as info:
        load(spec_path)
    assert info.value.message.startswith(message), info.value.message


def test_bodies_keep_newlines_and_tabs_and_a_crlf_file_loads(spec_path: Path) -> None:
    text = SPEC.replace("Why this commit", "Why\tthis commit").replace("hints.", "\thints.")
    spec_path.write_bytes(text.replace("\n", "\r\n").encode())
    spec = load(spec_path)
    assert spec.commits[0].message == "refactor: extract validation\n\nWhy\tthis commit exists."
    assert spec.commits[1].hints == "Multi-line\n\thints."


def test_a_control_character_stops_the_command_as_a_spec_error(spec_path: Path) -> None:
    spec_path.write_text(SPEC.replace('message = "feat: oauth"', 'message = "feat\\u001b[2J"'))
    result = cli("execute", str(spec_path), "--sandbox", "local", "--non-interactive")
    assert result.code == SpecError.exit_code, result.out + result.err
    assert "[[commit]] #2 → message: control character U+001B" in result.err
    assert "\x1b" not in result.out + result.err
