"""What a setup reads of the tree, for the few commands whose reads are known: then its
environment is keyed on exactly those files, not on every manifest of the tree.

- `pip install NAME…` (the `pip`, `pip3` or `pip3.N` on PATH; never `python -m pip`, which puts
  the workspace first on `sys.path`, so a tracked `pip/` or `json.py` would run) reads no file
  of the tree when every argument is a requirement by name and every option is one that names
  no file; `-r FILE` and `-c FILE` read those files, and the files they name with `-r`/`-c`,
  when each line of them is such a requirement or option.
- `cargo fetch` with a `Cargo.lock` at the root reads the lock, every `Cargo.toml` (workspace
  members and path dependencies), `.cargo/config(.toml)` and `rust-toolchain(.toml)`.
- `npm ci` reads `package.json`, its lock and `.npmrc`, when the package has no workspaces, no
  local (`file:`, linked) dependency and nothing that runs at install (or `--ignore-scripts`):
  no install script of its own, no `binding.gyp` (npm builds it), and no dependency the lock
  marks `hasInstallScript` (a generator such as Prisma's reads the tree).

A setup entry may chain such commands with `&&`, on one line. Anything else (another program,
another option, a path, a URL, a variable, a glob, a redirection, `;`, `|`, a new line, a
quote joined to a word) is not classified, and neither is a file it reads that is not a
regular file (a link): the whole setup keeps the conservative keying (every manifest, see
`envkeys.DEFAULT_INPUTS`). A wrong classification would keep a stale environment, a missed
one only prepares more often; requirements files are read as pip reads them (its line
joining and comments), and anything pip would read otherwise (another encoding, quotes in an
option line) is not classified.
Pure: the tree's entries and a reader of its blobs, no git, no Docker.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable

from retcon_sandbox.backends.manifests import REGULAR
from retcon_sandbox.repo.gitrepo import TreeEntry

ReadBlob = Callable[[str], bytes | None]
Entries = dict[str, TreeEntry]

_PIPS = re.compile(r"pip(3(\.[0-9]+)?)?")
# A requirement by name: `name`, `name[extra,other]`, `name==1.2`, `name>=1,<2`, `name~=1.4`.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_SPEC = r"(?:===?|~=|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+"
_REQUIREMENT = re.compile(rf"{_NAME}(?:\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?"
                          rf"\s*(?:{_SPEC}(?:\s*,\s*{_SPEC})*)?")
_MARKER = re.compile(r"[A-Za-z0-9_.'\"<>=!~ ()]*")  # after `;`: no path, URL or variable
_ARCHIVES = (".whl", ".zip", ".tar", ".gz", ".tgz", ".bz2", ".tbz", ".xz", ".txz", ".tlz",
             ".lz", ".tar.lzma")
_URL = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!&'()*+,;=%-]+")
# pip's options that name no file (with the values they take, if any)
_PIP_FLAGS = frozenset({"-U", "--upgrade", "--no-deps", "-q", "--quiet", "-v", "--verbose",
                        "--pre", "--no-cache-dir", "--prefer-binary", "--force-reinstall",
                        "-I", "--ignore-installed", "--no-build-isolation", "--no-input",
                        "--disable-pip-version-check", "--no-color", "--no-warn-script-location",
                        "--no-compile", "--isolated", "--require-hashes", "--no-index"})
_PIP_VALUES = {"--upgrade-strategy": r"eager|only-if-needed", "--progress-bar": r"[a-z]+",
               "--only-binary": r"[A-Za-z0-9:,._-]+", "--no-binary": r"[A-Za-z0-9:,._-]+",
               "--retries": r"[0-9]+", "--timeout": r"[0-9.]+", "-i": _URL.pattern,
               "--index-url": _URL.pattern, "--extra-index-url": _URL.pattern,
               "--root-user-action": r"[a-z]+"}
_PIP_FILES = {"-r": "-r", "--requirement": "-r", "-c": "-c", "--constraint": "-c"}
# In a requirements file, the options pip allows there that name no file
_LINE_VALUES = {k: v for k, v in _PIP_VALUES.items()
                if k in ("-i", "--index-url", "--extra-index-url", "--only-binary",
                         "--no-binary")}
_LINE_FLAGS = frozenset({"--pre", "--prefer-binary", "--require-hashes", "--no-index"})
_HASH = re.compile(r"--hash[= ](sha256|sha384|sha512):[0-9a-f]+")
_COMMENT = re.compile(r"(^|\s+)#.*$")  # pip's COMMENT_RE
_CODING = re.compile(rb"coding[:=]\s*([-\w.]+)")  # pip decodes a file by such a cookie
_REQ_FILES = 32  # the most requirements files followed (a cycle ends too)
_REQ_LIMIT = 256 * 1024

_CARGO_FLAGS = frozenset({"--locked", "--frozen", "--offline", "-q", "--quiet", "-v",
                          "--verbose"})
_CARGO_VALUES = {"--target": r"[A-Za-z0-9_.-]+"}
_CARGO_READS = (".cargo/config.toml", ".cargo/config", "rust-toolchain.toml", "rust-toolchain",
                "Cargo.lock")

_NPM_FLAGS = frozenset({"--ignore-scripts", "--no-audit", "--no-fund", "-q", "--quiet",
                        "--silent", "--prefer-offline", "--no-progress", "--production"})
_NPM_VALUES = {"--omit": r"dev|optional|peer", "--include": r"dev|optional|peer",
               "--loglevel": r"[a-z]+"}
_NPM_READS = ("package.json", "package-lock.json", "npm-shrinkwrap.json", ".npmrc")
_LIFECYCLE = ("preinstall", "install", "postinstall", "prepublish", "preprepare", "prepare",
              "postprepare", "dependencies")

_SHELL = set("$`*?[]{}\\#")  # expansion, globbing, escapes, comments: words the shell changes


class Unknown(Exception):
    """A command whose reads of the tree are not known."""


def known_reads(setup: tuple[str, ...], entries: Entries, read: ReadBlob
                ) -> frozenset[str] | None:
    """The tracked files the setup commands read, when every command is one whose reads are
    known (see the module's docstring); None when any is not."""
    found: set[str] = set()
    try:
        for entry in setup:
            for argv in simple_commands(entry):
                found |= command_reads(argv, entries, read)
    except Unknown:
        return None
    if any(entries[path].mode not in REGULAR for path in found):
        return None  # a link: the tool reads its target, which the key would not hold
    return frozenset(found)


def simple_commands(text: str) -> list[list[str]]:
    """`text` as the simple commands `&&` joins, each a list of words, when no word is one
    the shell would expand or glob, and nothing but `&&` joins them (Unknown otherwise). A new
    line ends a command for the shell (not for shlex), and a quote joined to a word makes one
    word for the shell (two for shlex in this mode): neither is classified."""
    text = text.strip(" \t\r\n")  # what sh ignores around a command
    if "\n" in text or "\r" in text:
        raise Unknown("a command on several lines")
    lexer = shlex.shlex(text, posix=False, punctuation_chars=True)
    lexer.commenters = ""
    lexer.whitespace_split = True
    try:
        raw = list(lexer)
    except ValueError:
        raise Unknown("unbalanced quotes") from None
    _separated(text, raw)
    commands: list[list[str]] = [[]]
    for token in raw:
        if token == "&&":
            commands.append([])
        elif set(token) <= set("();<>|&"):
            raise Unknown(f"shell syntax {token!r}")
        else:
            commands[-1].append(_word(token))
    if any(not words for words in commands):
        raise Unknown("an empty command")
    return commands


def _separated(text: str, tokens: list[str]) -> None:
    """Unknown unless each word of `tokens` stands apart in `text` (whitespace or an operator
    on each side), as it does for the shell."""
    position = 0
    for token in tokens:
        while position < len(text) and text[position] in " \t\r\n":  # shlex's whitespace
            position += 1
        if not text.startswith(token, position):
            raise Unknown(f"a word the shell reads otherwise: {token!r}")
        end = position + len(token)
        after = text[end:end + 1]
        operator = set(token) <= set("();<>|&")
        if not operator and after and not after.isspace() and after not in "();<>|&":
            raise Unknown(f"a word joined to the next: {token!r}")
        position = end


def _word(token: str) -> str:
    """A shell word's value: a quoted word (single quotes, or double quotes holding nothing the
    shell expands) as it is quoted; an unquoted word without expansion, glob or escape."""
    if len(token) >= 2 and token[0] == token[-1] == "'" and "'" not in token[1:-1]:
        return token[1:-1]
    if len(token) >= 2 and token[0] == token[-1] == '"' and not set(token[1:-1]) & set('"$`\\'):
        return token[1:-1]
    if set(token) & (_SHELL | set("'\"")) or token.startswith("~"):
        raise Unknown(f"a word the shell changes: {token!r}")
    return token


def command_reads(argv: list[str], entries: Entries, read: ReadBlob) -> set[str]:
    program = argv[0]
    if _PIPS.fullmatch(program) and argv[1:2] == ["install"]:
        return _pip(argv[2:], entries, read)
    if program == "cargo" and argv[1:2] == ["fetch"]:
        return _cargo(argv[2:], entries)
    if program == "npm" and argv[1:2] == ["ci"]:
        return _npm(argv[2:], entries, read)
    raise Unknown(f"{program}: not a command whose reads are known")


def _options(args: list[str], flags: frozenset[str], values: dict[str, str]
             ) -> tuple[list[str], list[tuple[str, str]]]:
    """(positional arguments, (option, value) pairs) of `args`: every option a known flag or
    a known option whose value matches its pattern (`--opt VALUE`, `--opt=VALUE`), or
    Unknown. `-rFILE`-style short options with a value are split."""
    positional: list[str] = []
    pairs: list[tuple[str, str]] = []
    rest = list(args)
    while rest:
        word = rest.pop(0)
        if not word.startswith("-"):
            positional.append(word)
            continue
        if word in flags:
            continue
        if word.startswith("--"):
            name, eq, value = word.partition("=")
        else:  # `-rFILE`; `-r=FILE` names the file `=FILE` for pip (optparse)
            name, value = word[:2], word[2:]
            eq = "=" if value else ""
            if value.startswith("="):
                raise Unknown(f"option {word!r}")
        if name not in values:
            raise Unknown(f"option {word!r}")
        if not eq:
            if not rest:
                raise Unknown(f"option {word!r} without its value")
            value = rest.pop(0)
        if not re.fullmatch(values[name], value):
            raise Unknown(f"{name} {value!r}")
        pairs.append((name, value))
    return positional, pairs


def _pip(args: list[str], entries: Entries, read: ReadBlob) -> set[str]:
    files = {k: r".+" for k in _PIP_FILES}
    positional, pairs = _options(args, _PIP_FLAGS, {**_PIP_VALUES, **files})
    for word in positional:
        _requirement(word)
    named = [value for option, value in pairs if option in _PIP_FILES]
    return _requirements_files(named, "", entries, read)


def _requirement(text: str) -> None:
    """A requirement by name (no path, archive, URL or direct reference), or Unknown. pip
    installs a tracked archive named without a folder (`pkg-1.0-py3-none-any.whl[x]`): a name
    that ends as an archive does, extras or not, is not one."""
    spec, _, marker = text.partition(";")
    spec = spec.strip()
    if not _REQUIREMENT.fullmatch(spec) or local_archive(spec) or \
            not _MARKER.fullmatch(marker):
        raise Unknown(f"not a requirement by name: {text!r}")


def local_archive(requirement: str) -> bool:
    """Whether pip would install `requirement` from a file of the working directory
    (`pkg-1.0-py3-none-any.whl[x]`, `six==1.0.zip`): its name, or all of it with its trailing
    extras stripped (as pip strips them), ends as an archive does."""
    name = re.match(_NAME, requirement)
    bare = re.sub(r"\[[^\]]*\]$", "", requirement).lower()
    return bare.endswith(_ARCHIVES) or name is None or \
        name.group(0).lower().endswith(_ARCHIVES)


def _requirements_files(names: list[str], directory: str, entries: Entries, read: ReadBlob
                        ) -> set[str]:
    """The requirements files `names` (from `directory`) and those they name in turn, each a
    tracked regular file whose every line names no file but these (else Unknown)."""
    found: set[str] = set()
    pending = [(directory, name) for name in names]
    while pending:
        base, name = pending.pop()
        path = _path(base, name)
        if path in found:
            continue
        entry = entries.get(path)
        if entry is None or entry.mode not in REGULAR or len(found) >= _REQ_FILES:
            raise Unknown(f"requirements file {name!r}")
        found.add(path)
        data = read(entry.sha)
        if data is None or len(data) > _REQ_LIMIT:
            raise Unknown(f"requirements file {path!r} unread")
        cookies = [_CODING.search(line) for line in data.split(b"\n")[:2]
                   if line.startswith(b"#")]
        if any(c is not None and c.group(1).lower() not in (b"utf-8", b"utf8") for c in cookies):
            raise Unknown(f"requirements file {path!r} declares another encoding")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise Unknown(f"requirements file {path!r} is not UTF-8") from None
        here = path.rpartition("/")[0]
        pending += [(here, nested) for nested in _requirement_lines(text)]
    return found


def _requirement_lines(text: str) -> list[str]:
    """The files a requirements file's `-r`/`-c` lines name; Unknown for any line that names
    another file, a path, a URL, an editable install or a variable, or that pip would split
    otherwise than on ASCII spaces (quotes and escapes in an option line: pip's shlex)."""
    named: list[str] = []
    for raw in _logical_lines(text):
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        if "${" in line or not line.isascii():
            raise Unknown("a variable or a character beyond ASCII in a requirements file")
        line = _HASH.sub("", line).strip()
        words = line.split()
        if not words:
            raise Unknown("a requirements file's line of hashes alone")
        if words[0].startswith("-") and set(line) & set("'\"\\"):
            raise Unknown("a quote or an escape in a requirements file's option line")
        if words[0].startswith("-"):
            _, pairs = _options(words, _LINE_FLAGS, {**_LINE_VALUES,
                                                     **{k: r".+" for k in _PIP_FILES}})
            named += [value for option, value in pairs if option in _PIP_FILES]
        else:
            _requirement(line)
    return named


def _logical_lines(text: str) -> list[str]:
    """A requirements file's lines as pip joins them (its `join_lines`): a line ending in `\\`
    goes on in the next, unless it holds a comment; a comment line ends a continued one."""
    out: list[str] = []
    pending: list[str] = []
    for line in text.splitlines():
        comment = _COMMENT.match(line) is not None
        if not line.endswith("\\") or comment:
            line = " " + line if comment else line
            out.append("".join([*pending, line]))
            pending = []
        else:
            pending.append(line.strip("\\"))
    if pending:
        out.append("".join(pending))
    return out


def _path(directory: str, name: str) -> str:
    """A file named from `directory`, as a repository path; Unknown when it climbs out or is
    absolute (not the tree's)."""
    if name.startswith(("/", "~")) or ":" in name:
        raise Unknown(f"{name!r}: not a path in the tree")
    parts = [p for p in directory.split("/") if p]
    named = False  # `..` after a folder the name gives: that folder may be a link
    for part in name.split("/"):
        if part == "..":
            if not parts or named:
                raise Unknown(f"{name!r} climbs out of the tree, or out of a folder it names")
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
            named = True
    return "/".join(parts)


def _cargo(args: list[str], entries: Entries) -> set[str]:
    positional, _ = _options(args, _CARGO_FLAGS, _CARGO_VALUES)
    if positional or "Cargo.lock" not in entries or "Cargo.toml" not in entries:
        raise Unknown("cargo fetch without a Cargo.lock at the root")
    if ".cargo" in entries:  # a link, not a folder: cargo reads its target's config
        raise Unknown("a .cargo that is not a folder")
    manifests = {p for p in entries if p.rsplit("/", 1)[-1] == "Cargo.toml"}
    return manifests | {p for p in _CARGO_READS if p in entries}


def _npm(args: list[str], entries: Entries, read: ReadBlob) -> set[str]:
    positional, _ = _options(args, _NPM_FLAGS, _NPM_VALUES)
    lock = next((p for p in ("npm-shrinkwrap.json", "package-lock.json") if p in entries), None)
    if positional or lock is None or "package.json" not in entries:
        raise Unknown("npm ci without a package.json and its lock at the root")
    package, locked = _json(entries["package.json"], read), _json(entries[lock], read)
    if "workspaces" in package:
        raise Unknown("a package with workspaces")
    packages = locked.get("packages", {})
    if not isinstance(packages, dict) or not isinstance(locked.get("dependencies", {}), dict):
        raise Unknown("a lock file of another form")
    if "--ignore-scripts" not in args and _runs_at_install(package, packages, entries):
        raise Unknown("a package or dependency that runs a script at install")
    for where, record in packages.items():
        local = where != "" and not where.startswith("node_modules/")  # a workspace's
        if not isinstance(record, dict) or local or record.get("link") or \
                str(record.get("resolved", "")).startswith("file:"):
            raise Unknown("a local or linked dependency")
    if _local_dependency(locked.get("dependencies", {})):
        raise Unknown("a local dependency (lockfile version 1)")
    return {p for p in _NPM_READS if p in entries}


def _runs_at_install(package: dict[str, object], packages: dict[str, object],
                     entries: Entries) -> bool:
    """Whether `npm ci` runs anything of the package's or a dependency's: a lifecycle script,
    the `node-gyp rebuild` npm runs for a `binding.gyp` at the root, or a dependency's script
    (the lock says `hasInstallScript`; a lock of version 1 does not say, so it may)."""
    scripts = package.get("scripts")
    if isinstance(scripts, dict) and any(name in scripts for name in _LIFECYCLE):
        return True
    if "binding.gyp" in entries and package.get("gypfile") is not False:
        return True
    if not packages:
        return True
    return any(isinstance(r, dict) and r.get("hasInstallScript") for r in packages.values())


def _local_dependency(dependencies: object) -> bool:
    """Whether a lockfile-version-1 `dependencies` tree has a `file:` version, at any depth."""
    if not isinstance(dependencies, dict):
        return True
    for record in dependencies.values():
        if not isinstance(record, dict) or str(record.get("version", "")).startswith("file:"):
            return True
        if _local_dependency(record.get("dependencies", {})):
            return True
    return False


def _json(entry: TreeEntry, read: ReadBlob) -> dict[str, object]:
    data = read(entry.sha) if entry.mode in REGULAR else None
    try:
        loaded = json.loads(data or b"")
    except ValueError:
        raise Unknown("not JSON") from None
    if not isinstance(loaded, dict):
        raise Unknown("not a JSON object")
    return loaded

