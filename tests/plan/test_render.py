"""The drafted spec reads back as the spec it describes."""

from __future__ import annotations

from pathlib import Path

from retcon_sandbox.plan.draft import Group
from retcon_sandbox.plan.render import Branches, GuessedCommands, guess_commands, spec_text
from retcon_sandbox.spec.file import parse

ODD = ['plain', 'two\nlines', "quote ''' inside\nand more", 'ends with quote\'\nx',
       'back\\slash "q"\nz', "control \x1b char\nq", "tab\tthere"]


def test_the_text_parses_to_the_groups_with_an_empty_history() -> None:
    groups = [Group((f"f{i}.py", 'we"ird name.py' if i == 0 else f"g{i}.py"), message,
                    f"hint {message}", "code") for i, message in enumerate(ODD)]
    text = spec_text(Branches("feat/x", "main", "feat/x-clean"), groups,
                     GuessedCommands("make", None, "retcon-sandbox/rust", "Cargo.toml"),
                     "A draft.\nSecond line.")
    assert text.startswith("# A draft.\n# Second line.\n")
    spec = parse(Path("spec.toml"), text)
    assert (spec.source, spec.remote, spec.cleaned) == ("feat/x", "main", "feat/x-clean")
    assert spec.sandbox.build == "make" and spec.sandbox.test is None
    assert spec.sandbox.image == "retcon-sandbox/rust"
    # control characters escaped visibly (a spec refuses them), a subject's tab too
    assert [c.message for c in spec.commits] == [
        m.replace("\x1b", "\\e").replace("tab\tthere", "tab\\tthere") for m in ODD]
    assert spec.commits[0].hints == "hint plain" and spec.commits[6].hints == "hint tab\tthere"
    assert [c.paths for c in spec.commits] == [g.paths for g in groups]
    assert all(c.history == () for c in spec.commits)
    assert text.count("history = []") == len(ODD)


def test_commands_guessed_from_the_tree() -> None:
    assert guess_commands(frozenset({"Cargo.toml", "src/lib.rs"})).test == \
        "cargo test --offline"
    assert guess_commands(frozenset({"package.json"})).test == "npm test"
    python = guess_commands(frozenset({"pkg/a.py", "tests/test_a.py"}))
    assert python.build and python.test and "pytest" in python.test
    assert guess_commands(frozenset({"pkg/a.py"})).test is None
    assert guess_commands(frozenset({"pkg/a.py", "pkg/a_test.py"})).test  # pytest collects it
    assert guess_commands(frozenset({"README.md"})) == GuessedCommands()


def test_a_src_layout_is_tested_with_src_on_the_path() -> None:
    """`python3 -m pytest` puts the root on sys.path: a package under src/ needs PYTHONPATH."""
    src = guess_commands(frozenset({"pyproject.toml", "src/click/__init__.py",
                                    "src/click/core.py", "tests/test_core.py"}))
    assert src.test == "PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider"
    assert "src layout" in src.reason
    for flat in ({"click/__init__.py", "tests/test_core.py"},  # at the root
                 {"src/tool.py", "tests/test_tool.py"},  # a module in src/, not a package
                 {"src/a/b/__init__.py", "tests/test_b.py"}):  # not a top-level package
        assert guess_commands(frozenset(flat)).test == "python3 -m pytest -q -p no:cacheprovider"


def test_the_setup_a_layout_declares_is_suggested_commented_out() -> None:
    """Setup is the one step with network: the draft names it, the user opts in."""
    assert guess_commands(frozenset({"pyproject.toml", "a.py"})).setup == "pip install -e ."
    assert guess_commands(frozenset({"a.py", "tests/test_a.py"})).setup is None
    assert guess_commands(frozenset({"Cargo.toml", "Cargo.lock"})).setup == "cargo fetch"
    assert guess_commands(frozenset({"Cargo.toml"})).setup is None
    assert guess_commands(frozenset({"package.json", "package-lock.json"})).setup == "npm ci"
    assert guess_commands(frozenset({"package.json"})).setup is None
    declared = '[project]\nname = "p"\n[project.optional-dependencies]\ndocs = ["x"]\n'
    assert guess_commands(frozenset({"pyproject.toml", "a.py"}),
                          {"pyproject.toml": declared + 'testing = ["pytest"]\n'}).setup == \
        "pip install -e '.[testing]'"
    for odd in (declared, "not toml [", "project = 1", "[project]\noptional-dependencies = 2",
                "[project]\n" + "a." * 300 + "b = 1"):  # no test extra: none named
        assert guess_commands(frozenset({"pyproject.toml", "a.py"}),
                              {"pyproject.toml": odd}).setup == "pip install -e ."
    commands = guess_commands(frozenset({"setup.py", "pkg/a.py", "tests/test_a.py"}))
    text = spec_text(Branches("a", "b", "c"), [Group(("x",), "m", "h", "code")], commands, "A")
    assert parse(Path("spec.toml"), text).sandbox.setup == ()
    opted_in = text.replace('# setup = "pip install -e ."', 'setup = "pip install -e ."')
    assert opted_in != text
    assert parse(Path("spec.toml"), opted_in).sandbox.setup == ("pip install -e .",)


def test_tox_ini_s_test_requirements_join_the_suggested_setup() -> None:
    """What tox installs for the tests, plain requirements only, each quoted for the shell."""
    tox = ("[tox]\nenvlist = py38\n[testenv]\ndeps =\n    pytest\n    freezegun >= 1.0\n"
           "    -r requirements/docs.txt\n    py38: mock\n    {[base]deps}\n    ./local\n"
           "    https://example.com/x.whl\n    x; rm -rf /\n    pytest\n"
           "commands = pytest\n[testenv:style]\ndeps = pre-commit\n")
    files = frozenset({"setup.py", "src/p/__init__.py", "tests/test_p.py", "tox.ini"})
    assert guess_commands(files, {"tox.ini": tox}).setup == \
        "pip install -e . pytest 'freezegun>=1.0'"
    assert guess_commands(frozenset({"a.py", "tox.ini"}), {"tox.ini": tox}).setup == \
        "pip install pytest 'freezegun>=1.0'"  # not a package: its requirements alone
    for odd in ("[testenv\ndeps = a\n", "no section", "[testenv]\n[testenv]\ndeps=\n",
                "[testenv]\ndeps = %(x)s\n", "\x00"):
        assert guess_commands(files, {"tox.ini": odd}).setup == "pip install -e ."
    extras = "[testenv]\nextras =\n    tests\n    cov, x;y\n"  # setup.cfg's extras_require
    assert guess_commands(files, {"tox.ini": extras}).setup == "pip install -e '.[tests,cov]'"
    assert guess_commands(files, {"tox.ini": extras, "pyproject.toml":
                                  "[project.optional-dependencies]\ntest = []\n"}).setup == \
        "pip install -e '.[test]'"  # the pyproject's own test extra first
    spaced = "[testenv]\nextras = tests\n    # a comment\n\n\tcov\ndeps=a\nx" + " " * 99_999 + "y\n"
    assert guess_commands(files, {"tox.ini": spaced}).setup == "pip install -e '.[tests,cov]' a"
    archives = ("[testenv]\ndeps =\n    pytest\n    evil-1.0-py3-none-any.whl\n    mal.tar.gz\n"
                "    six==1.0.zip\n    pkg.tar.lzma[x]\n    backports.lzma\n")  # pip: files
    assert guess_commands(files, {"tox.ini": archives}).setup == \
        "pip install -e . pytest backports.lzma"
    many = "[testenv]\ndeps =\n" + "".join(f"    p{i}\n" for i in range(50))
    assert len((guess_commands(files, {"tox.ini": many}).setup or "").split()) == 4 + 20


def test_a_header_holding_control_characters_stays_a_comment() -> None:
    text = spec_text(Branches("a", "b", "c"), [Group(("x",), "m", "h", "code")], GuessedCommands(),
                     "model said: \x00 \r\x0b\x1b[31m red\u202e\nsecond")
    assert parse(Path("spec.toml"), text).commits[0].paths == ("x",)
    assert all(line.startswith("#") for line in text.splitlines()[:2])


def test_a_path_pattern_matches_its_own_name() -> None:
    from retcon_sandbox.paths import Patterns, pattern
    from retcon_sandbox.plan.render import path_pattern

    names = ["a[1].py", "a*.py", "q?.py", " lead.txt", "trail.txt ", "new\nline.py", "x/y.py",
             "d/[x]/*.md", "tab\t.md", "del\x7f", b"caf\xe9.txt".decode("utf-8", "surrogateescape")]
    for name in names:
        entry = path_pattern(name)
        assert pattern(entry) == entry  # a valid `paths` entry, unchanged by normalisation
        assert Patterns((entry,)).matches(name), (name, entry)
    assert path_pattern("a*.py") == "a[*].py" and not Patterns(("a[*].py",)).matches("ab.py")
    assert path_pattern("plain/name.py") == "plain/name.py"


def test_a_name_that_is_not_utf8_is_written_as_a_pattern_a_spec_can_hold() -> None:
    """Its byte is `?` in `paths`: the spec is UTF-8 text, and it still names that file."""
    from retcon_sandbox.paths import Patterns

    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    text = spec_text(Branches("a", "b", "c"), [Group((name,), "m", "h", "code")], GuessedCommands(),
                     "draft")
    parsed = parse(Path("spec.toml"), text.encode("utf-8").decode("utf-8"))
    assert parsed.commits[0].paths == ("caf?.txt",)
    assert Patterns(parsed.commits[0].paths).matches(name)
