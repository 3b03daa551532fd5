"""Preparations made against those needed, on real ranges, side by side with 0.3.0's keying.

    python3 bench/setup_keys.py [--mirrors /work/.mirror]

For each range (a repository's first-parent commits, from a local clone or bare mirror) and each
setup, the environment key of the base tree and of every commit's tree is computed as a run
computes it (no Docker: the base image's ID is fixed). A run prepares one environment per
distinct key, so that is the count of preparations made. It is printed for the keying of 0.3.0
(every manifest of the tree, by its dependency tables: `inputs`; with today's list of the tables
that never change an install, so `rust-version` is quiet in both) and for today's
(`keyed_inputs`: exactly the files a `pip install NAME`, `-r`, `cargo fetch` or `npm ci` reads),
beside the preparations needed: the distinct values of what the command installs from, read
by an oracle of this script's own (nothing for `pip install NAME`; the requirement lines of `-r`
files; the build system, dependencies and extras of pyproject.toml for `pip install -e .`; the
registry packages of Cargo.lock for `cargo fetch`). Where more are made than needed, the
reasons (`why_new`) are listed. Nothing is asserted: these are figures to read.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from retcon_sandbox.backends import manifests
from retcon_sandbox.backends.envkeys import (
    DEFAULT_INPUTS,
    environment_key,
    input_record,
    inputs,
    keyed_inputs,
    why_new,
)
from retcon_sandbox.paths import Patterns
from retcon_sandbox.repo.gitrepo import TreeEntry
from retcon_sandbox.spec.settings import SandboxSettings

Oracle = Callable[[dict[str, TreeEntry], Callable[[str], bytes | None]], object]


@dataclass(frozen=True)
class Case:
    repository: str  # owner+name under --mirrors
    base: str  # the range is base..tip, first parents
    tip: str
    setup: str
    needed: str  # the oracle's name


CASES = [
    Case("pallets+itsdangerous", "0df2193", "7edfa12", "pip install freezegun", "none"),
    Case("pallets+itsdangerous", "0df2193", "7edfa12", "pip install -e .", "pyproject"),
    Case("pallets+itsdangerous", "6567d65~1", "d408c5e", "pip install -r requirements/tests.txt",
         "requirements"),
    Case("mahmoud+boltons", "HEAD~12", "HEAD", "pip install pytest", "none"),
    Case("more-itertools+more-itertools", "HEAD~12", "HEAD", "pip install -e .", "pyproject"),
    Case("sharkdp+hexyl", "HEAD~16", "HEAD", "cargo fetch", "cargo"),
]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={repo}", *args], check=True,
                          capture_output=True, text=True).stdout


class Reader:
    """A repository's trees and blobs, read once each."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self._blobs: dict[str, bytes] = {}

    def entries(self, commit: str) -> dict[str, TreeEntry]:
        found = {}
        for line in git(self.repo, "ls-tree", "-r", "-z", "--full-tree", commit).split("\0"):
            if line:
                meta, path = line.split("\t", 1)
                mode, _, sha = meta.split(" ")
                found[path] = TreeEntry(mode, sha)
        return found

    def blob(self, sha: str) -> bytes | None:
        if sha not in self._blobs:
            self._blobs[sha] = subprocess.run(["git", f"--git-dir={self.repo}", "cat-file",
                                               "blob", sha], check=True,
                                              capture_output=True).stdout
        data = self._blobs[sha]
        return data if len(data) <= manifests.MANIFEST_LIMIT else None


def _toml(entries: dict[str, TreeEntry], read: Callable[[str], bytes | None], path: str
          ) -> dict[str, object]:
    entry = entries.get(path)
    data = read(entry.sha) if entry else None
    return tomllib.loads(data.decode()) if data else {}


def _requirements(entries: dict[str, TreeEntry], read: Callable[[str], bytes | None],
                  path: str) -> object:
    entry = entries.get(path)
    lines = []
    for raw in (read(entry.sha) or b"").decode().splitlines() if entry else []:
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        if line.startswith(("-r ", "-c ")):
            lines.append(_requirements(entries, read, str(Path(path).parent / line[3:])))
        elif line:
            lines.append(line)
    return sorted(map(str, lines))


def _pyproject(entries: dict[str, TreeEntry], read: Callable[[str], bytes | None]) -> object:
    doc = _toml(entries, read, "pyproject.toml")
    project = doc.get("project", {})
    assert isinstance(project, dict)
    setup = [entries[p].sha for p in ("setup.py", "setup.cfg") if p in entries]
    return [doc.get("build-system"), project.get("name"), project.get("dependencies"),
            project.get("optional-dependencies"), project.get("dynamic"), setup]


def _cargo(entries: dict[str, TreeEntry], read: Callable[[str], bytes | None]) -> object:
    packages = _toml(entries, read, "Cargo.lock").get("package", [])
    assert isinstance(packages, list)
    return sorted((p["name"], p["version"], p.get("checksum", "")) for p in packages
                  if p.get("source"))


def oracle(case: Case) -> Oracle:
    if case.needed == "none":
        return lambda entries, read: None
    if case.needed == "requirements":
        path = case.setup.split("-r ", 1)[1]
        return lambda entries, read: _requirements(entries, read, path)
    return {"pyproject": _pyproject, "cargo": _cargo}[case.needed]


def measure(case: Case, mirrors: Path) -> None:
    repo = mirrors / case.repository / "repo"
    if not repo.exists():
        repo = mirrors / case.repository
    reader = Reader(repo)
    commits = [git(repo, "rev-parse", case.base).strip(),
               *git(repo, "rev-list", "--reverse", "--first-parent",
                    f"{case.base}..{case.tip}").split()]
    settings = SandboxSettings.parse({"setup": case.setup})
    before: dict[str, dict[str, object]] = {}
    after: dict[str, dict[str, object]] = {}
    needed: list[str] = []
    reasons: list[str] = []
    for commit in commits:
        entries = reader.entries(commit)
        old = inputs(entries, Patterns(DEFAULT_INPUTS), settings.setup, None, reader.blob)
        new, known = keyed_inputs(entries, settings, None, reader.blob)
        before.setdefault(environment_key("sha256:x", settings.setup, True, None, old),
                          input_record("sha256:x", settings.setup, True, None, old))
        key = environment_key("sha256:x", settings.setup, True, None, new, "", known)
        if key not in after:
            record = input_record("sha256:x", settings.setup, True, None, new)
            previous = list(after.values())[-1] if after else None
            reasons.append(f"{commit[:9]}: {why_new(previous, record)}")
            after[key] = record
        value = json.dumps(oracle(case)(entries, reader.blob), sort_keys=True, default=str)
        if value not in needed:
            needed.append(value)
    name = case.repository.split("+", 1)[1]
    print(f"{name:16} {case.base}..{case.tip} ({len(commits) - 1} commits + base)  "
          f"`{case.setup}`")
    print(f"    prepared: {len(before)} keyed on every manifest, {len(after)} now; needed "
          f"{len(needed)}{'' if len(after) <= len(needed) else '  <- more than needed'}")
    if len(after) > len(needed):
        for reason in reasons[1:]:
            print(f"      {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"),
                        help="where OWNER+NAME/repo (or OWNER+NAME) clones are")
    args = parser.parse_args()
    for case in CASES:
        measure(case, args.mirrors)


if __name__ == "__main__":
    main()
