"""File kinds and imports, from text alone."""

from __future__ import annotations

from retcon_sandbox.plan.kinds import kind
from retcon_sandbox.sourceimports import imports


def test_kinds() -> None:
    assert kind("tests/test_cart.py") == "test"
    assert kind("src/cart_test.go") == "test"
    assert kind("web/cart.test.ts") == "test"
    assert kind("docs/guide.md") == "docs"
    assert kind("README.md") == "docs"
    assert kind("mkdocs.yml") == "docs"
    assert kind("Cargo.toml") == "config"
    assert kind("requirements-dev.txt") == "config"
    assert kind("shop/cart.py") == "code"


TREE = frozenset({"shop/__init__.py", "shop/cart.py", "shop/validation.py",
                  "src/notes/store.py", "src/notes/tags.py", "pkg/sub/mod.py", "pkg/helper.py"})


def test_python_imports() -> None:
    text = ("from shop.cart import Cart\nfrom shop import (\n    validation,  # x\n)\n"
            "import os, shop.cart\n")
    assert imports("tests/test_x.py", text, TREE) == {"shop/cart.py", "shop/validation.py"}
    assert imports("src/notes/store.py", "from notes.tags import parse\n", TREE) == \
        {"src/notes/tags.py"}
    assert imports("pkg/sub/mod.py", "from ..helper import h\nfrom . import mod\n", TREE) == \
        {"pkg/helper.py"}


def test_a_from_line_does_not_swallow_the_next_one() -> None:
    text = "from shop.cart import Cart\nfrom shop.validation import check\n"
    assert imports("t.py", text, TREE) == {"shop/cart.py", "shop/validation.py"}


def test_rust_modules_and_uses() -> None:
    tree = frozenset({"src/lib.rs", "src/point.rs", "src/shape/mod.rs", "src/shape/square.rs"})
    assert imports("src/lib.rs", "pub mod point;\nmod shape;\n", tree) == \
        {"src/point.rs", "src/shape/mod.rs"}
    assert imports("src/shape/mod.rs", "pub mod square;\nuse crate::point::Point;\n", tree) == \
        {"src/shape/square.rs", "src/point.rs"}
    assert imports("tests/t.rs", "use geom::shape::square::Square;\nuse std::fmt;\n", tree) == \
        {"src/shape/square.rs"}


def test_javascript_relative_imports() -> None:
    tree = frozenset({"web/a.ts", "web/lib/index.js", "web/b.jsx"})
    text = "import x from './a'\nconst l = require('./lib')\nimport('./b.jsx')\nimport 'react'\n"
    assert imports("web/main.ts", text, tree) == {"web/a.ts", "web/lib/index.js", "web/b.jsx"}


def test_other_languages_import_nothing() -> None:
    assert imports("main.go", 'import "fmt"\n', frozenset({"fmt"})) == set()


def test_a_text_file_among_code_is_data_and_one_at_the_root_is_docs() -> None:
    from retcon_sandbox.plan.kinds import kind, test_file

    assert kind("app/data/stopwords.txt") == "code"
    assert kind("NOTES.txt") == kind("docs/howto.txt") == kind("pkg/README.txt") == "docs"
    assert test_file("tests/test_a.py") and test_file("web/a.spec.ts")
    assert not test_file("tests/conftest.py") and not test_file("tests/data/input.json")
