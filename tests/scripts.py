"""Scripted model conversations over the demo repository (shared by both test tiers)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from retcon_sandbox.repo import demoproject as d
from tests.fake_openai import Call, Fault, Step, call

# What the faults ask for (OpenAI's `retry-after-ms`): the retry is real, its wait short.
QUICK_RETRY = (("retry-after-ms", "20"),)
BROKEN_DISCOUNTS = "def discounted_total(cart, code=None:\n    return 0\n"


def write(path: str, content: str) -> Call:
    return call("write_file", path=path, content=content)


def reconstruction() -> list[Step]:
    """Four commits from the demo's ten messy ones, through faults, malformed calls and a fix."""
    return [
        # commit 1: a rate limit, a look at the diff, a server error, two malformed calls, work
        Fault(429, headers=QUICK_RETRY),
        [call("read_diff")],
        Fault(500, headers=QUICK_RETRY),
        [call("rm_rf", path="/"), call("write_file", raw='{"path": "shop/validation.py"'),
         call("read_file", offset=3)],
        [write("shop/validation.py", d.VALIDATION), write("shop/cart.py", d.CART),
         write("tests/test_validation.py", d.TEST_VALIDATION),
         call("delete_file", path="shop/legacy_checks.py"),
         call("create_commit", message="Move validation")],
        # commit 2: a first attempt that does not build, then a fix in the fix loop
        "Let me think about discounts first.",
        [write("shop/discounts.py", BROKEN_DISCOUNTS), call("create_commit", message="discounts")],
        [call("read_file", path="shop/discounts.py"), write("shop/discounts.py", d.DISCOUNTS),
         call("run_build")],
        [call("create_commit", message="Fix the signature's syntax error")],
        # commit 3 and 4
        [write("tests/test_discounts.py", d.TEST_DISCOUNTS), call("run_tests")],
        [call("create_commit", message="tests")],
        [write("README.md", d.README), write("docs/discounts.md", d.DOCS),
         call("create_commit", message="docs")],
    ]


def stuck_then_fixed() -> tuple[list[Step], list[Step]]:
    first: list[Step]
    second: list[Step]
    """Commit 2 is reported stuck; after a `resolved` note, the run finishes."""
    first = [
        [write("shop/validation.py", d.VALIDATION), write("shop/cart.py", d.CART),
         write("tests/test_validation.py", d.TEST_VALIDATION),
         call("delete_file", path="shop/legacy_checks.py"),
         call("create_commit", message="m")],
        [call("report_stuck", summary="discounts need a helper that commit 4 introduces; "
              "reorder or merge the commits")],
    ]
    second = [
        [write("shop/discounts.py", d.DISCOUNTS), call("create_commit", message="m")],
        [write("tests/test_discounts.py", d.TEST_DISCOUNTS), call("create_commit", message="m")],
        [write("README.md", d.README), write("docs/discounts.md", d.DOCS),
         call("create_commit", message="m")],
    ]
    return first, second


def with_gaps(assign: Sequence[Step]) -> list[Step]:
    """The reconstruction, but commit 1 forgets tests/test_validation.py and commit 4 forgets
    docs/discounts.md; `assign` is what the model answers in the remainder step."""
    script = reconstruction()
    script[4] = [write("shop/validation.py", d.VALIDATION), write("shop/cart.py", d.CART),
                 call("delete_file", path="shop/legacy_checks.py"),
                 call("create_commit", message="Move validation")]
    script[-1] = [write("README.md", d.README), call("create_commit", message="docs")]
    return [*script, *assign]


def by_request(needs_fix: bool = True) -> Callable[[dict[str, Any]], Step]:
    """The demo's four commits, each answer chosen from the request itself (which commit, an
    extraction or a fix, which turn), so that the same question always gets the same answer
    whatever the order of the questions: a pipelined run asks ahead, and may ask again. With
    `needs_fix`, commit 2's first version does not build and a fix follows."""
    extract: dict[int, list[Step]] = {
        1: [[write("shop/validation.py", d.VALIDATION), write("shop/cart.py", d.CART),
             write("tests/test_validation.py", d.TEST_VALIDATION),
             call("delete_file", path="shop/legacy_checks.py"),
             call("create_commit", message="m")]],
        2: [[write("shop/discounts.py", BROKEN_DISCOUNTS if needs_fix else d.DISCOUNTS),
             call("create_commit", message="m")]],
        3: [[write("tests/test_discounts.py", d.TEST_DISCOUNTS),
             call("create_commit", message="m")]],
        4: [[write("README.md", d.README), write("docs/discounts.md", d.DOCS),
             call("create_commit", message="m")]],
    }
    fix: list[Step] = [[write("shop/discounts.py", d.DISCOUNTS),
                        call("create_commit", message="Fix the signature's syntax error")]]

    def respond(body: dict[str, Any]) -> Step:
        messages = body["messages"]
        task = str(messages[1]["content"])
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        found = re.match(r"Commit (\d+) of", task)
        assert found, task[:200]
        steps = fix if "does not pass yet" in task.split("\n", 1)[0] else \
            extract[int(found.group(1))]
        return steps[turn] if turn < len(steps) else [call("create_commit", message="m")]

    return respond
