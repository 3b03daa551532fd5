"""Messy branches of real shape with gold plans, for the planner's tests and bench/plan.py.

Each fixture is a base tree, messy commits that interleave three or four concerns (with WIP,
"fix" and "typo" commits), and the plan a careful person would make. `calc` and `notes` are
Python projects whose every gold prefix builds and passes its tests; `geom` is a Rust crate
(planned, never built here).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from retcon_sandbox.repo import demoproject as demo_project
from retcon_sandbox.repo.gitrepo import Repo

Files = dict[str, str | None]


@dataclass(frozen=True)
class Fixture:
    name: str
    base: dict[str, str]
    messy: list[tuple[str, Files]]
    gold: list[tuple[str, list[str]]]  # message, paths
    build: str | None = None
    test: str | None = None

    def create(self, directory: Path) -> Repo:
        """The repository: `main` with the base, `feature` with the messy commits on top."""
        directory.mkdir(parents=True, exist_ok=True)
        repo = Repo.init(directory, "main")
        repo.commit_files("main", dict(self.base), "Initial commit")
        repo.update_branch("feature", repo.resolve("main"), None, "branch")
        for message, files in self.messy:
            repo.commit_files("feature", files, message)
        return repo

    @property
    def gold_groups(self) -> list[list[str]]:
        return [paths for _, paths in self.gold]


# --- calc: a parser refactor, a rename and a statistics feature, interleaved -----------------

CALC_CORE = '''"""Arithmetic on numbers written as text."""


def parse_number(text):
    return float(text.strip())


def add(a, b):
    return a + b


def evaluate(expression):
    left, _, right = expression.partition("+")
    return add(parse_number(left), parse_number(right))
'''
CALC_CORE_NEW = '''"""Arithmetic on numbers written as text."""

from calc.parser import parse_number


def add(a, b):
    return a + b


def evaluate(expression):
    left, _, right = expression.partition("+")
    return add(parse_number(left), parse_number(right))
'''
CALC_PARSER_WIP = '''"""Parsing numbers."""


def parse_number(text):
    return float(text)
'''
CALC_PARSER = '''"""Parsing numbers and lists of numbers."""


def parse_number(text):
    return float(text.strip())


def parse_list(text):
    return [parse_number(part) for part in text.split(",") if part.strip()]
'''
CALC_UTIL = '''"""Number helpers."""


def clamp(value, low, high):
    return max(low, min(high, value))
'''
CALC_FORMAT = '''"""Formatting results."""

from calc.util import clamp


def percent(value):
    return f"{clamp(value, 0, 1) * 100:.0f}%"
'''
CALC_FORMAT_NEW = CALC_FORMAT.replace("from calc.util import", "from calc.numbers import")
CALC_FORMAT_FINAL = CALC_FORMAT_NEW.replace(':.0f}%"', ':.0f} %"')
CALC_STATS_WIP = '''"""Statistics over lists of numbers."""

from calc.parser import parse_list


def mean(text):
    values = parse_list(text)
    return sum(values) / len(values)
'''
CALC_STATS = CALC_STATS_WIP + '''

def spread(text):
    values = parse_list(text)
    return max(values) - min(values)
'''
CALC_TEST_PARSER_WIP = '''from calc.parser import parse_number


def test_number():
    assert parse_number("2") == 2
'''
CALC_TEST_PARSER = '''from calc.parser import parse_list, parse_number


def test_number():
    assert parse_number(" 2 ") == 2


def test_list():
    assert parse_list("1, 2,3,") == [1, 2, 3]
'''
CALC_TEST_STATS_WIP = '''from calc.stats import mean


def test_mean():
    assert mean("1,2,3") == 2
'''
CALC_TEST_STATS = CALC_TEST_STATS_WIP.replace("import mean", "import mean, spread") + '''

def test_spread():
    assert spread("4, 1, 3") == 3
'''

CALC = Fixture(
    "calc",
    base={
        "calc/__init__.py": '"""calc."""\n',
        "calc/core.py": CALC_CORE,
        "calc/util.py": CALC_UTIL,
        "calc/format.py": CALC_FORMAT,
        "tests/test_core.py": "from calc.core import evaluate\n\n\ndef test_evaluate():\n"
                              '    assert evaluate("1 + 2") == 3\n',
        "README.md": "# calc\n\nArithmetic on numbers written as text.\n",
    },
    messy=[
        ("wip parser", {"calc/parser.py": CALC_PARSER_WIP, "calc/stats.py": CALC_STATS_WIP}),
        ("rename util", {"calc/numbers.py": CALC_UTIL, "calc/util.py": None,
                         "calc/format.py": CALC_FORMAT_NEW}),
        ("stuff", {"calc/core.py": CALC_CORE_NEW, "tests/test_parser.py": CALC_TEST_PARSER_WIP}),
        ("stats", {"tests/test_stats.py": CALC_TEST_STATS_WIP}),
        ("fix", {"calc/parser.py": CALC_PARSER}),
        ("docs wip", {"README.md": "# calc\n\nArithmetic on numbers written as text.\n\nTODO\n"}),
        ("more stats", {"calc/stats.py": CALC_STATS, "tests/test_stats.py": CALC_TEST_STATS}),
        ("fix tests", {"tests/test_parser.py": CALC_TEST_PARSER}),
        ("docs", {"docs/stats.md": "# Statistics\n\n`mean` and `spread` of `1,2,3`.\n",
                  "README.md": "# calc\n\nArithmetic on numbers written as text, and "
                               "statistics (docs/stats.md).\n"}),
        ("oops", {"calc/format.py": CALC_FORMAT_FINAL}),
    ],
    gold=[
        ("refactor: move number parsing into calc/parser.py",
         ["calc/core.py", "calc/parser.py", "tests/test_parser.py"]),
        ("refactor: rename calc/util.py to calc/numbers.py",
         ["calc/format.py", "calc/numbers.py", "calc/util.py"]),
        ("feat: mean and spread of a list of numbers", ["calc/stats.py", "tests/test_stats.py"]),
        ("docs: statistics", ["README.md", "docs/stats.md"]),
    ],
    build="python3 -m compileall -q .",
    test="python3 -m pytest -q -p no:cacheprovider",
)

# --- notes: a src layout; tags, markdown export and a user guide, interleaved ------------------

NOTES_PYPROJECT = '''[project]
name = "notes"
version = "0.1.0"

[project.optional-dependencies]
tests = ["pytest"]
'''  # no pytest `pythonpath`: the guessed test command puts src/ on the path
NOTES_STORE = '''"""Notes kept in a dict."""


class Store:
    def __init__(self):
        self.notes = {}

    def save(self, title, body):
        self.notes[title] = body
        return title
'''
NOTES_STORE_NEW = '''"""Notes kept in a dict, with tags."""

from notes.tags import parse_tags


class Store:
    def __init__(self):
        self.notes = {}
        self.tags = {}

    def save(self, title, body):
        self.notes[title] = body
        self.tags[title] = parse_tags(body)
        return title
'''
NOTES_TAGS_WIP = '''"""Tags: #words in a note."""


def parse_tags(body):
    return [word[1:] for word in body.split() if word.startswith("#")]
'''
NOTES_TAGS = '''"""Tags: #words in a note, lower-cased, each once."""


def parse_tags(body):
    found = [word[1:].lower() for word in body.split() if word.startswith("#") and len(word) > 1]
    return list(dict.fromkeys(found))
'''
NOTES_EXPORT_WIP = '''"""Export notes as Markdown."""

from notes.store import Store


def to_markdown(store: Store):
    return "".join(f"# {title}\\n" for title in store.notes)
'''
NOTES_EXPORT = '''"""Export notes as Markdown."""

from notes.store import Store


def to_markdown(store: Store):
    return "\\n".join(f"# {title}\\n\\n{body}\\n" for title, body in store.notes.items())
'''
NOTES_TEST_EXPORT_WIP = '''from notes.export import to_markdown
from notes.store import Store


def test_empty():
    assert to_markdown(Store()) == ""
'''
NOTES_TEST_EXPORT = NOTES_TEST_EXPORT_WIP + '''

def test_one():
    store = Store()
    store.save("a", "b")
    assert to_markdown(store) == "# a\\n\\nb\\n"
'''
NOTES_TEST_TAGS = '''from notes.tags import parse_tags


def test_tags():
    assert parse_tags("#A b #a #c #") == ["a", "c"]
'''

NOTES = Fixture(
    "notes",
    base={
        "pyproject.toml": NOTES_PYPROJECT,
        "tox.ini": "[tox]\nenv_list = py311\n\n[testenv]\ndeps =\n    pytest-timeout\n",
        "src/notes/__init__.py": '"""notes."""\n',
        "src/notes/store.py": NOTES_STORE,
        "tests/test_store.py": "from notes.store import Store\n\n\ndef test_save():\n"
                               '    assert Store().save("a", "b") == "a"\n',
        "docs/index.md": "# notes\n\nA note store.\n",
        "mkdocs.yml": "site_name: notes\nnav:\n  - index.md\n",
    },
    messy=[
        ("start tags", {"src/notes/tags.py": NOTES_TAGS_WIP,
                        "docs/guide.md": "# Guide\n\nTODO\n"}),
        ("export", {"src/notes/export.py": NOTES_EXPORT_WIP,
                    "tests/test_export.py": NOTES_TEST_EXPORT_WIP}),
        ("wip", {"src/notes/store.py": NOTES_STORE_NEW,
                 "mkdocs.yml": "site_name: notes\nnav:\n  - index.md\n  - guide.md\n"}),
        ("tests", {"tests/test_tags.py": NOTES_TEST_TAGS}),
        ("guide", {"docs/guide.md": "# Guide\n\nWrite #tags in a note; export with "
                                    "to_markdown.\n",
                   "docs/index.md": "# notes\n\nA note store. See the guide.\n"}),
        ("fix export", {"src/notes/export.py": NOTES_EXPORT,
                        "pyproject.toml": NOTES_PYPROJECT.replace("0.1.0", "0.2.0")}),
        ("tags done", {"src/notes/tags.py": NOTES_TAGS}),
        ("fix ci", {"tests/test_export.py": NOTES_TEST_EXPORT}),
        ("nav", {"mkdocs.yml": "site_name: notes\nnav:\n  - Home: index.md\n"
                               "  - Guide: guide.md\n"}),
        ("typo", {"docs/index.md": "# notes\n\nA note store. See the [guide](guide.md).\n"}),
    ],
    gold=[
        ("feat: tags in notes", ["src/notes/store.py", "src/notes/tags.py",
                                 "tests/test_tags.py"]),
        ("feat: export notes as Markdown", ["pyproject.toml", "src/notes/export.py",
                                            "tests/test_export.py"]),
        ("docs: user guide", ["docs/guide.md", "docs/index.md", "mkdocs.yml"]),
    ],
    build="python3 -m compileall -q src tests",
    test="PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider",
)

# --- geom: a Rust crate; shapes, a rename in point and docs, interleaved ----------------------

GEOM = Fixture(
    "geom",
    base={
        "Cargo.toml": '[package]\nname = "geom"\nversion = "0.1.0"\nedition = "2021"\n',
        "src/lib.rs": "pub mod point;\n",
        "src/point.rs": "pub struct Point { pub x: f64, pub y: f64 }\n\n"
                        "pub fn dist(a: &Point, b: &Point) -> f64 {\n"
                        "    ((a.x - b.x).powi(2) + (a.y - b.y).powi(2)).sqrt()\n}\n",
        "tests/point.rs": "use geom::point::{dist, Point};\n\n#[test]\nfn zero() {\n"
                          "    let p = Point { x: 0.0, y: 0.0 };\n"
                          "    assert_eq!(dist(&p, &p), 0.0);\n}\n",
        "README.md": "# geom\n",
    },
    messy=[
        ("shapes wip", {"src/shape.rs": "use crate::point::Point;\n\npub struct Square { "
                                        "pub corner: Point, pub side: f64 }\n",
                        "src/lib.rs": "pub mod point;\npub mod shape;\n"}),
        ("rename dist", {"src/point.rs": "pub struct Point { pub x: f64, pub y: f64 }\n\n"
                                         "pub fn distance(a: &Point, b: &Point) -> f64 {\n"
                                         "    ((a.x - b.x).powi(2) + (a.y - b.y).powi(2))"
                                         ".sqrt()\n}\n",
                         "tests/point.rs": "use geom::point::{distance, Point};\n"}),
        ("changelog", {"CHANGELOG.md": "# Changelog\n\n- Squares.\n"}),
        ("wip", {"src/shape.rs": "use crate::point::Point;\n\npub struct Square { pub corner: "
                                 "Point, pub side: f64 }\n\nimpl Square {\n    pub fn area("
                                 "&self) -> f64 { self.side * self.side }\n}\n",
                 "Cargo.toml": '[package]\nname = "geom"\nversion = "0.2.0"\n'
                               'edition = "2021"\n'}),
        ("tests", {"tests/shape.rs": "use geom::shape::Square;\nuse geom::point::Point;\n"}),
        ("fix", {"tests/point.rs": "use geom::point::{distance, Point};\n\n#[test]\nfn zero() {"
                                   "\n    let p = Point { x: 0.0, y: 0.0 };\n"
                                   "    assert_eq!(distance(&p, &p), 0.0);\n}\n"}),
        ("readme", {"README.md": "# geom\n\nPoints and squares.\n",
                    "CHANGELOG.md": "# Changelog\n\n- Squares.\n- `dist` is `distance`.\n"}),
        ("clippy", {"src/shape.rs": "use crate::point::Point;\n\npub struct Square { pub "
                                    "corner: Point, pub side: f64 }\n\nimpl Square {\n    pub "
                                    "fn area(&self) -> f64 {\n        self.side * self.side\n"
                                    "    }\n}\n",
                    "src/point.rs": "/// A point.\npub struct Point { pub x: f64, pub y: f64 }"
                                    "\n\npub fn distance(a: &Point, b: &Point) -> f64 {\n"
                                    "    ((a.x - b.x).powi(2) + (a.y - b.y).powi(2)).sqrt()\n"
                                    "}\n"}),
    ],
    gold=[
        ("refactor: rename point::dist to distance", ["src/point.rs", "tests/point.rs"]),
        ("feat: squares", ["Cargo.toml", "src/lib.rs", "src/shape.rs", "tests/shape.rs"]),
        ("docs: squares and distance", ["CHANGELOG.md", "README.md"]),
    ],
)


def _demo_gold() -> list[tuple[str, list[str]]]:
    final = set(demo_project.BASE)
    for _, files in demo_project.MESSY:
        final |= set(files)
    gold = []
    for message, _hints, paths in demo_project.COMMITS:
        matched = sorted(p for p in final if any(p == q or p.startswith(q + "/") for q in paths))
        gold.append((message.splitlines()[0], matched))
    return gold


DEMO = Fixture("demo", dict(demo_project.BASE), list(demo_project.MESSY), _demo_gold(),
               "python3 -m compileall -q shop tests", "python3 -m pytest -q -p no:cacheprovider")

ALL = (DEMO, CALC, NOTES, GEOM)
