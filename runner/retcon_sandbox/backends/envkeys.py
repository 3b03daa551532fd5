"""What keys a prepared environment: pure functions of a tree's entries and the settings.

An environment is keyed by the base image's ID, the setup commands, the git-metadata choice and
version tag, and what setup reads of the files `setup_inputs` matches in the tree being prepared
for (by default the usual manifests and lock files of Python, Node, Rust and Go projects; of
pyproject.toml and Cargo.toml only their dependency tables, see `manifests`), and the whole
content of every tracked file setup names (`setup_files`: the script it runs, a `-r` file, a
makefile, and what those name in turn), so a branch cannot change what setup runs and keep
another tree's key. A setup whose every command reads known files (`pip install NAME`, `-r`
files of names, `cargo fetch` with a lock, `npm ci`: see `setupreads`) is keyed on exactly
those. The `setup` event says why a new environment is made (`why_new`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable

from retcon_sandbox.backends import manifests, setupreads
from retcon_sandbox.backends.manifests import Fingerprint, ReadBlob
from retcon_sandbox.paths import Patterns
from retcon_sandbox.repo.gitrepo import TreeEntry
from retcon_sandbox.sourceimports import imports
from retcon_sandbox.spec.settings import SandboxSettings

# At any depth (workspaces, monorepos). Requirements and constraints files key it when setup
# reads them: named by a command, by a file setup reads (`-r base.txt`), or by pyproject.toml's
# [tool.setuptools.dynamic]; a docs/requirements.txt that no setup reads does not.
DEFAULT_INPUTS = tuple(f"**/{name}" for name in (
    "pyproject.toml", "setup.py", "setup.cfg", "Pipfile", "Pipfile.lock", "poetry.lock",
    "pdm.lock", "uv.lock",
    "package.json", "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml",
    "Cargo.toml", "Cargo.lock", "rust-toolchain.toml", "rust-toolchain", ".cargo/config.toml",
    ".cargo/config", "go.mod", "go.sum",
    # what the installers read besides: npm's, yarn's and pnpm's settings and hooks
    ".npmrc", ".yarnrc", ".yarnrc.yml", "pnpm-workspace.yaml", ".pnpmfile.cjs",
))
CACHE_PREFIX = "retcon-sandbox-cache-"


Place = tuple[str, int]  # a commit, and how many commits after it a tree sits (its version)
Version = tuple[str | None, int]  # the tag the workspace's git metadata has, and the distance
# How the workspace's git metadata is made, in the verification cache's key: 2, its HEAD holds
# the tree's own entries, in every sandbox (before, a sandbox opened ahead kept the previous
# tree's, and a result kept then is not reused)
GIT_METADATA = 2


DATA_SUFFIXES = (".txt", ".in", ".toml", ".lock", ".json", ".yaml", ".yml", ".cfg", ".sum",
                 ".mod")
DATA_NAMES = ("Pipfile",)


def cache_name(scope: str, source: str, setup: tuple[str, ...], entries: dict[str, TreeEntry],
               link: LinkTarget | None = None, read: ReadBlob | None = None) -> str:
    """The package cache (a volume) a setup uses: one per repository, per `source` (the branch
    whose commits run: a spec's source, or the tip of the range verified) and per what setup
    runs, its commands and the content of the files they name that are not data (scripts,
    makefiles, a vendored package's code). Code a setup runs without naming it (a setup.py,
    build.rs) can write into the cache, so a cache is shared only by one branch's commits,
    which are one author's code: another branch of the repository never reads it. A commit
    that changes the setup script gets a cache of its own; one that changes only a requirements
    file shares the cache, and downloads what is new."""
    runs = sorted((path, entries[path].mode, entries[path].sha)
                  for path in setup_files(setup, entries, link, read)
                  if not path.endswith(DATA_SUFFIXES)
                  and path.rsplit("/", 1)[-1] not in DATA_NAMES)
    text = json.dumps({"v": 2, "repository": scope, "source": source, "setup": list(setup),
                       "runs": runs})
    return f"{CACHE_PREFIX}{hashlib.sha256(text.encode()).hexdigest()[:24]}"



def scope_digest(scope: str) -> str:
    """The value of LABEL_ENV_SCOPE: a hash of the scope (its path is not shown)."""
    return hashlib.sha256(b"retcon-sandbox env scope\0" + scope.encode()).hexdigest()[:32]



LinkTarget = Callable[[TreeEntry], str]  # the text of a tracked symbolic link


def manifest_references(entries: dict[str, TreeEntry], read: ReadBlob | None
                        ) -> tuple[str, ...]:
    """The files an install reads because a manifest says so: what each pyproject.toml's
    [tool.setuptools.dynamic] names (`file = [...]`), and the tracked files each setup.py or
    setup.cfg names (`open("requirements.txt")`, `file: requirements.txt`), from its own
    directory or the root. Files only: a directory a setup.py names (`src`) holds the code,
    whose changes need no new environment."""
    if read is None:
        return ()
    found: list[str] = []
    for path, entry in entries.items():
        name = path.rsplit("/", 1)[-1]
        if entry.mode not in manifests.REGULAR or name not in _DECLARING:
            continue
        data = read(entry.sha)
        if data is None or len(data) > manifests.MANIFEST_LIMIT:
            continue
        directory = path.rpartition("/")[0]
        if name == "pyproject.toml":
            found += filter(None, (_normal(_joined(directory, named))
                                   for named in manifests.dynamic_files(data)))
        elif b"\0" not in data:
            text = data.decode("utf-8", "replace")
            found += sorted(p for p in _named_by(text, ["", directory] if directory else [""])
                            if p in entries and p != path)
    return tuple(found)


_DECLARING = ("pyproject.toml", "setup.py", "setup.cfg")


def inputs(entries: dict[str, TreeEntry], patterns: Patterns, setup: tuple[str, ...] = (),
           link: LinkTarget | None = None, read: ReadBlob | None = None) -> Fingerprint:
    """The files that key the environment, each with its parts (see `manifests`): each match
    of `patterns`, narrowed to what setup reads of it when `read` gives its bytes (the
    dependency tables of pyproject.toml and Cargo.toml), and each tracked file a setup command
    names (`setup_files`), always by its whole content: what setup runs keys it in full."""
    links = tuple(p for p, e in entries.items()  # a manifest (or .cargo) as a link: its
                  if e.mode == "120000" and  # target keys too
                  (patterns.matches(p) or p.rsplit("/", 1)[-1] == ".cargo"))
    named = setup_files(setup, entries, link, read, manifest_references(entries, read) + links)
    return {path: (manifests.whole(e.mode, e.sha) if path in named
                   else manifests.parts(path, e.mode, e.sha, read))
            for path, e in sorted(entries.items()) if path in named or patterns.matches(path)}


def keyed_inputs(entries: dict[str, TreeEntry], settings: SandboxSettings,
                 link: LinkTarget | None = None, read: ReadBlob | None = None
                 ) -> tuple[Fingerprint, bool]:
    """The files that key a setup's environment, and whether they are exactly what its
    commands read (`setupreads`): then each is keyed by what an installer reads of it (see
    `manifests`), and nothing else is. Otherwise (a command whose reads are not known, or
    `setup_inputs` chosen in the spec) `inputs`: every manifest, and every file setup names."""
    patterns = Patterns(DEFAULT_INPUTS if settings.setup_inputs is None
                        else settings.setup_inputs)
    if settings.setup_inputs is None and read is not None:
        reads = setupreads.known_reads(settings.setup, entries, read)
        if reads is not None:
            return {path: manifests.parts(path, entries[path].mode, entries[path].sha, read)
                    for path in sorted(reads)}, True
    return inputs(entries, patterns, settings.setup, link, read), False


_WORD = re.compile(r"[^\s'\"`;&|()<>=,:]+")  # a word of a shell command, loosely
_QUOTED = re.compile(r"'([^'\n]+)'|\"([^\"\n]+)\"")  # a quoted word may hold spaces
# A tool a setup command runs may run files no word names: a crate's build script, npm's
# lifecycle scripts (`package.json` "postinstall", read for the files they name in turn).
_TOOL_FILES = {"cargo": ("build.rs",)}
_NODE_TOOLS = ("npm", "npx", "yarn", "pnpm")
_LIFECYCLE = ("preinstall", "install", "postinstall", "prepublish", "preprepare", "prepare",
              "postprepare", "dependencies")
_MAKEFILES = ("GNUmakefile", "makefile", "Makefile")
_SCANNED = 64  # named files whose text is read for the files they name in turn
_SCAN_LIMIT = 256 * 1024


def setup_files(setup: tuple[str, ...], entries: dict[str, TreeEntry],
                link: LinkTarget | None = None, read: ReadBlob | None = None,
                also: tuple[str, ...] = ()) -> set[str]:
    """The tracked files that setup commands name, and so may run or read. A word of a command
    (split loosely, so that quoted and nested commands, `-r FILE`, `-rFILE`, `--opt=FILE` and
    `<FILE` count too) names a path from the root or from any directory a `cd` in the command
    names; a named file counts, and so does every file under a named directory (but the root);
    a word with a shell pattern (`cp *.pth`, `req/[a-c]?.txt`) names what it matches in the tree;
    `make` names the makefiles; a tracked symbolic link names its target too. With `read`, the
    text of each named file is read the same way (from the root and from its own directory):
    the script a script sources, the `-r base.txt` of a requirements file. `also`: paths named
    otherwise (a manifest's file references). Naming more than setup reads only prepares an
    environment more often."""
    found: set[str] = set(also)
    for command in setup:
        found.update(_named_by(command, [""]))
        if read is not None and any(w.rsplit("/", 1)[-1] in _NODE_TOOLS
                                    for w in _WORD.findall(command)):
            found.update(_lifecycle_named(entries, read))
    return _followed(found, entries, link, read)


def _lifecycle_named(entries: dict[str, TreeEntry], read: ReadBlob) -> set[str]:
    """What the install scripts of each package.json name (npm runs them on `npm ci`), from
    that file's directory; the scripts' text itself keys the environment with the file. A
    `binding.gyp` beside it counts too: npm builds it (`node-gyp rebuild`), from the sources it
    names."""
    found: set[str] = set()
    for path, entry in entries.items():
        if path.rsplit("/", 1)[-1] != "package.json" or entry.mode not in manifests.REGULAR:
            continue
        gyp = _joined(path.rpartition("/")[0], "binding.gyp")
        if gyp in entries:
            found.add(gyp)
        data = read(entry.sha)
        try:
            scripts = json.loads(data or b"{}").get("scripts")
        except (ValueError, AttributeError):
            continue
        if not isinstance(scripts, dict):
            continue
        directory = path.rpartition("/")[0]
        for name in _LIFECYCLE:
            if isinstance(scripts.get(name), str):
                found.update(_named_by(scripts[name], [directory]))
    return found


def _named_by(text: str, directories: list[str]) -> set[str]:
    """The paths `text` names from the root or from `directories` (a `cd` adds its own): its
    words and quoted words, `-m` modules and the files of the tools it runs."""
    found: set[str] = set()
    directories = list(directories)
    words = _WORD.findall(text)
    for previous, word in zip(["", *words], words, strict=False):
        candidates = {word, word[2:]} if word.startswith("-") and len(word) > 2 else {word}
        candidates.add(re.sub(r"\[[^\]]*\]$", "", word))  # pip's `pkg.whl[extra]`
        if previous == "-m":
            candidates.update(_module_paths(word))
        for path in filter(None, map(_normal, candidates)):
            if previous == "cd":
                directories.append(path if path != "." else "")
        found.update(_under(directories, candidates))
        tool = word.rsplit("/", 1)[-1]
        if tool in ("make", "gmake"):
            found.update(_joined(d, name) for d in directories for name in _MAKEFILES)
        found.update(_joined(d, name) for d in directories for name in _TOOL_FILES.get(tool, ()))
    quoted = {a or b for a, b in _QUOTED.findall(text)}
    found.update(_under(directories, quoted))
    found.discard(".")
    return found


def _under(directories: list[str], words: set[str]) -> set[str]:
    """Each word as a path from each directory (`..` resolved after joining), if it can be."""
    return {path for word in words if not word.startswith(("/", "~"))
            for d in directories if (path := _normal(_joined(d, word)))}


def _module_paths(name: str) -> set[str]:
    """`a.b` -> `a/b.py` and the package folder `a/b` (every file under it)."""
    if not re.fullmatch(r"[\w.]+", name) or name.startswith("."):
        return set()
    path = name.strip(".").replace(".", "/")
    return {f"{path}.py", path} if path else set()


def _followed(found: set[str], entries: dict[str, TreeEntry], link: LinkTarget | None,
              read: ReadBlob | None) -> set[str]:
    """`found` with the files under named directories, the targets of named links and (with
    `read`) what named files name or import in turn."""
    named: set[str] = set()
    tree: frozenset[str] = frozenset()  # the tree's paths, once a scanned file needs them
    pending = sorted(found)
    scanned = 0
    while pending:  # ends: a path is followed once, and at most _SCANNED files add names
        path = pending.pop()
        entry = entries.get(path)
        if entry is None and _GLOB.search(path):
            pending.extend(sorted(_matching(path, entries) - named))
            continue
        if entry is None:
            prefix = path + "/"
            named.update(p for p in entries if p.startswith(prefix))
            continue
        if path in named:
            continue
        named.add(path)
        directory = path.rpartition("/")[0]
        if entry.mode == "120000" and link is not None:
            target = _normal(_joined(directory, link(entry)))
            if target and target != ".":
                pending.append(target)
        elif read is not None and scanned < _SCANNED and entry.mode in manifests.REGULAR:
            scanned += 1
            data = read(entry.sha)
            if data is not None and len(data) <= _SCAN_LIMIT and b"\0" not in data:
                text = data.decode("utf-8", "replace")
                tree = tree or frozenset(entries)
                runs = _named_by(text, ["", directory] if directory else [""]) | \
                    imports(path, text, tree, script=True)  # what a named script imports
                pending.extend(sorted(runs - named))
    return named


def _matching(pattern: str, entries: dict[str, TreeEntry]) -> set[str]:
    """The tree's files a shell pattern names: those it matches, and every file under a folder
    it matches (a `*` or `?` never crosses a `/`; a hidden name is matched too: more, not less,
    keys the environment)."""
    try:
        regex = re.compile("/".join(_glob_part(part) for part in pattern.split("/")))
    except re.error:  # a class no shell takes either (`[z-a]`): it matches nothing
        return set()
    depth = pattern.count("/") + 1
    return {path for path in entries
            if path.count("/") + 1 >= depth and regex.fullmatch("/".join(
                path.split("/")[:depth]))}


def _glob_part(part: str) -> str:
    """One path component of a shell pattern, as a regular expression."""
    out, i = [], 0
    while i < len(part):
        char = part[i]
        close = part.find("]", i + 2) if char == "[" else -1
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif close != -1:
            body = part[i + 1:close]
            negated = body[:1] in ("!", "^")
            body = body[1:] if negated else body
            out.append(("[^/" if negated else "[") + re.sub(r"([\\^\[\]])", r"\\\1", body)
                       + "]")
            i = close
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


_GLOB = re.compile(r"[*?\[]")


def _normal(word: str) -> str | None:
    """A word as a repository-relative path (`./a//b` is `a/b`, `a/../b` is `b`), or None if
    it cannot be one. A shell pattern stays one (`_matching` reads it)."""
    if word.startswith(("/", "~")) or "$" in word:
        return None
    parts: list[str] = []
    for part in word.split("/"):
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts) or "."


def _joined(directory: str, path: str) -> str:
    if not directory:
        return path
    return directory if path == "." else f"{directory}/{path}"


def environment_key(image_id: str, setup: tuple[str, ...], git: bool, tag: str | None,
                    files: Fingerprint, scope: str = "", known: bool = False) -> str:
    """`known`: `files` are exactly what the setup commands read (`keyed_inputs`)."""
    fields = {"v": 2, "image": image_id, "setup": list(setup), "git": git, "tag": tag,
              "inputs": files, "repository": scope, **({"reads": "known"} if known else {})}
    text = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def input_record(image_id: str, setup: tuple[str, ...], git: bool, tag: str | None,
                 files: Fingerprint, known: bool = False) -> dict[str, object]:
    """What an environment was made from, kept in its label (LABEL_ENV_INPUTS) so that the
    next one can say why it is made, and an imported one can be keyed in another clone
    (`envtransfer`). `known`: as for `environment_key`."""
    return {"image": image_id, "setup": list(setup), "git": git, "tag": tag, "inputs": files,
            **({"reads": "known"} if known else {})}


def why_new(previous: dict[str, object] | None, current: dict[str, object],
            fresh: bool = False) -> str:
    """Why an environment is made, against the newest one of the repository (`previous`, the
    record of its label; None when there is none)."""
    if fresh:
        return "--no-cache: prepared again"
    if previous is None:
        return "first environment for this repository"
    if not previous:
        return "the inputs changed (the newest environment kept no record of its own)"
    said = []
    if previous.get("setup") != current["setup"]:
        said.append("setup commands changed")
    if previous.get("image") != current["image"]:
        said.append("the base image changed")
    if previous.get("git") != current["git"] or previous.get("tag") != current["tag"]:
        said.append("the git metadata changed (version tag)")
    old = previous.get("inputs")
    said += manifests.changes(old if isinstance(old, dict) else None,
                              current["inputs"])  # type: ignore[arg-type]
    if not said:
        return ("the environment of these inputs is no longer kept" if isinstance(old, dict)
                else "the inputs changed")
    shown = said[:4] + ([f"and {len(said) - 4} more"] if len(said) > 4 else [])
    return ", ".join(shown)


LABEL_LIMIT = 256 * 1024


def record_label(record: dict[str, object]) -> str:
    """An input record as a label: without the inputs when they would make it too long."""
    text = json.dumps(record, sort_keys=True)
    return text if len(text) <= LABEL_LIMIT else json.dumps({**record, "inputs": None})



def unmatched_inputs(patterns: tuple[str, ...] | None, paths: list[str]) -> list[str]:
    """The user's `setup_inputs` patterns that match none of `paths` (the defaults may)."""
    return [] if patterns is None else Patterns(patterns).unmatched(paths)
