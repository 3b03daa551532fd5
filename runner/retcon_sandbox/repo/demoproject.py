"""The demo's messy branch: a small Python shop where a refactor, a feature, its tests and its
docs were committed interleaved, with WIP and "fix build" commits in between."""

from __future__ import annotations

BASE = {
    "shop/__init__.py": '"""A tiny shop."""\n',
    "shop/cart.py": '''"""A shopping cart."""


class Cart:
    def __init__(self):
        self.items = []

    def add(self, name, price, quantity=1):
        if quantity < 1:
            raise ValueError("quantity must be at least 1")
        if price < 0:
            raise ValueError("price must not be negative")
        self.items.append((name, price, quantity))

    def total(self):
        return sum(price * quantity for _, price, quantity in self.items)
''',
    "tests/test_cart.py": '''import pytest

from shop.cart import Cart


def test_total():
    cart = Cart()
    cart.add("apple", 3, 2)
    cart.add("pear", 5)
    assert cart.total() == 11


def test_rejects_bad_quantity():
    with pytest.raises(ValueError):
        Cart().add("apple", 3, 0)
''',
    "README.md": "# shop\n\nA tiny shop.\n",
    "shop/legacy_checks.py": '''"""Old validation helpers; the cart does its own checks now."""


def positive(value):
    return value > 0
''',
}

VALIDATION = '''"""Input validation shared by the cart and the discounts."""


def check_quantity(quantity):
    if quantity < 1:
        raise ValueError("quantity must be at least 1")


def check_price(price):
    if price < 0:
        raise ValueError("price must not be negative")
'''

CART = '''"""A shopping cart."""

from shop.validation import check_price, check_quantity


class Cart:
    def __init__(self):
        self.items = []

    def add(self, name, price, quantity=1):
        check_quantity(quantity)
        check_price(price)
        self.items.append((name, price, quantity))

    def total(self):
        return sum(price * quantity for _, price, quantity in self.items)
'''

# Committed half-edited: it does not even compile ("fix build" repairs it).
CART_WIP = CART.replace("    def add(self, name, price, quantity=1):",
                        "    def add(self, name, price, quantity=1)")

DISCOUNTS_WIP = '''"""Discount codes."""

from shop.validation import check_price

CODES = {"WELCOME10": 10}


def discounted_total(cart, code=None):
    total = cart.total()
    if code is None:
        return total
    print("DEBUG", code)
    return total * (100 - CODES[code]) / 100
'''

DISCOUNTS_DEBUG = '''"""Discount codes."""

from shop.validation import check_price

CODES = {"WELCOME10": 10, "SUMMER25": 25}


def percent_off(code):
    if not code.isalnum() or not code.isupper():
        raise ValueError(f"discount codes are upper-case letters and digits: {code!r}")
    if code not in CODES:
        raise KeyError(f"unknown discount code {code!r}")
    return CODES[code]


def discounted_total(cart, code=None):
    total = cart.total()
    if code is None:
        return total
    print("DEBUG", code, total)
    reduced = total * (100 - percent_off(code)) / 100
    check_price(reduced)
    return round(reduced, 2)
'''

DISCOUNTS = DISCOUNTS_DEBUG.replace('    print("DEBUG", code, total)\n', "")

TEST_VALIDATION_WIP = '''from shop.validation import check_price


def test_price():
    check_price(0)
'''

TEST_VALIDATION = '''import pytest

from shop.validation import check_price, check_quantity


def test_quantity():
    check_quantity(1)
    with pytest.raises(ValueError):
        check_quantity(0)


def test_price():
    check_price(0)
    with pytest.raises(ValueError):
        check_price(-1)
'''

# Written ahead of the code: SUMMER25 only exists from "more discount stuff" on.
TEST_DISCOUNTS_WIP = '''from shop.cart import Cart
from shop.discounts import discounted_total


def test_no_code():
    cart = Cart()
    cart.add("apple", 3, 2)
    assert discounted_total(cart) == 6


def test_summer_code():
    cart = Cart()
    cart.add("apple", 4)
    assert discounted_total(cart, "SUMMER25") == 3
'''

TEST_DISCOUNTS = '''import pytest

from shop.cart import Cart
from shop.discounts import discounted_total, percent_off


def make_cart():
    cart = Cart()
    cart.add("apple", 3, 2)
    cart.add("pear", 4)
    return cart


def test_no_code():
    assert discounted_total(make_cart()) == 10


def test_welcome_code():
    assert discounted_total(make_cart(), "WELCOME10") == 9


def test_unknown_code():
    with pytest.raises(KeyError):
        percent_off("NOPE1")


def test_malformed_code():
    with pytest.raises(ValueError):
        percent_off("welcome10")
'''

README = """# shop

A tiny shop.

## Discount codes

`discounted_total(cart, "WELCOME10")` takes 10% off the cart's total.
See docs/discounts.md for the codes.
"""

DOCS = """# Discount codes

| code      | off |
|-----------|-----|
| WELCOME10 | 10% |
| SUMMER25  | 25% |

Codes are upper-case letters and digits; an unknown code raises KeyError.
"""

MESSY: list[tuple[str, dict[str, str | None]]] = [
    ("WIP discounts", {"shop/discounts.py": DISCOUNTS_WIP}),
    ("move validation out of cart", {"shop/validation.py": VALIDATION,
                                     "shop/legacy_checks.py": None}),
    ("wip", {"shop/cart.py": CART_WIP,
             "README.md": BASE["README.md"] + "\n## Discount codes\n\nTODO\n"}),
    ("fix build", {"shop/cart.py": CART, "tests/test_validation.py": TEST_VALIDATION_WIP}),
    ("tests", {"tests/test_discounts.py": TEST_DISCOUNTS_WIP}),
    ("more discount stuff", {"shop/discounts.py": DISCOUNTS_DEBUG}),
    ("docs", {"docs/discounts.md": DOCS, "README.md": README}),
    ("remove debug print", {"shop/discounts.py": DISCOUNTS}),
    ("actually fix it", {"tests/test_validation.py": TEST_VALIDATION}),
    ("fix tests", {"tests/test_discounts.py": TEST_DISCOUNTS}),
]

PATHS_NOTE = """\
# Each [[commit]] below lists `paths`, so no model is needed;
# `retcon-sandbox demo --llm` writes the same spec with hints only."""
HINTS_NOTE = """\
# Each [[commit]] below has hints only: a model extracts the changes
# (`retcon-sandbox demo` without --llm writes the same spec with `paths`)."""

SPEC_HEAD = '''# retcon-sandbox demo: four clean commits out of ten messy ones.
{note}
# retcon-sandbox appends each commit's `history` as it works.
source = "feature"          # the messy branch
remote = "main"             # what it will merge into
cleaned = "feature-clean"   # the clean branch, created at merge-base(feature, main)

[sandbox]
build = "python3 -m compileall -q shop tests"
test = "python3 -m pytest -q -p no:cacheprovider"
'''

COMMITS = [
    ('''refactor: move input validation into shop/validation.py

The cart's checks become functions the discounts can reuse. No behaviour change.''',
     "Create shop/validation.py with check_quantity and check_price, use them in the cart, "
     "add tests/test_validation.py and delete the unused shop/legacy_checks.py. Nothing about "
     "discounts.",
     ["shop/validation.py", "shop/cart.py", "tests/test_validation.py",
      "shop/legacy_checks.py"]),
    ('''feat: discount codes

discounted_total(cart, code) applies a percentage code (WELCOME10, SUMMER25).''',
     "Only shop/discounts.py, without the debug print. Tests and docs come later.",
     ["shop/discounts.py"]),
    ("test: cover discount codes",
     "tests/test_discounts.py in its final form.",
     ["tests/test_discounts.py"]),
    ("docs: document discount codes",
     "README.md's Discount codes section and docs/discounts.md.",
     ["README.md", "docs"]),
]


def spec_text(with_paths: bool) -> str:
    parts = [SPEC_HEAD.format(note=PATHS_NOTE if with_paths else HINTS_NOTE)]
    for message, hints, paths in COMMITS:
        parts.append(f'\n[[commit]]\nmessage = """{message}"""\nhints = "{hints}"\n')
        if with_paths:
            parts.append("paths = [" + ", ".join(f'"{p}"' for p in paths) + "]\n")
    return "".join(parts)
