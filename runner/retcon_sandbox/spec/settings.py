"""The `[sandbox]` settings, each defined once: its key, how its value is parsed and checked,
its default, and what it means. The spec validates against this table, the backends read the
resulting `SandboxSettings`, and docs/spec.md's table is checked against it by a test.

Parsing is strict: sizes need a unit, every limit has a floor and a ceiling, zero and negative
values are refused (no setting can switch a limit off), and values reach Docker as numbers, never
as text spliced into options. A spec may come from someone else: it can only lower the resource
limits (LOWER_ONLY) below their defaults; raising one takes its command-line option. Its `image`
is a `name[:tag]` reference, never an image ID (IDs only with --image).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from retcon_sandbox.text import plain_number

KIB, MIB, GIB = 1024, 1024**2, 1024**3
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(k|m|g)(?:i?b)?", re.IGNORECASE)
_UNITS = {"k": KIB, "m": MIB, "g": GIB}


class SettingError(ValueError):
    """A value a setting refuses; the message says what is expected."""


def human_bytes(n: int) -> str:
    for unit, size in (("g", GIB), ("m", MIB), ("k", KIB)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n / MIB:.1f}m"


def size(floor: int, ceiling: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
        if not match:
            raise SettingError(f"expected a size with a unit, like \"512m\" or \"2g\" (from "
                               f"{human_bytes(floor)} to {human_bytes(ceiling)})")
        scaled = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if not math.isfinite(scaled) or not floor <= int(scaled) <= ceiling:
            raise SettingError(f"must be from {human_bytes(floor)} to {human_bytes(ceiling)}")
        return int(scaled)
    return parse


def number(floor: float, ceiling: float, integer: bool = False) -> Callable[[object], float]:
    def parse(value: object) -> float:
        ok = isinstance(value, int) if integer else isinstance(value, int | float)
        if not ok or isinstance(value, bool) or \
                (isinstance(value, float) and not math.isfinite(value)):
            raise SettingError(f"expected {'a whole number' if integer else 'a number'} from "
                               f"{plain_number(floor)} to {plain_number(ceiling)}")
        try:
            as_float = float(value)  # type: ignore[arg-type]
        except OverflowError:  # an integer too large for a float
            as_float = math.inf
        if not math.isfinite(as_float) or not floor <= as_float <= ceiling:
            raise SettingError(f"must be from {plain_number(floor)} to {plain_number(ceiling)}")
        return value  # type: ignore[return-value]
    return parse


# name[:tag], as Docker spells a reference without a digest: an optional registry host (with a
# port), lowercase path components, and a tag.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
                        r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?")
_HEX_ID = re.compile(r"(?:sha256:)?[0-9a-f]{64}")


def reference(value: object) -> str:
    """A spec's image: `name[:tag]` only. An ID, a digest (`@sha256:...`) or `sha256:...` is
    refused (a spec could name any image on the engine by its ID); so is a name the engine
    would take as an ID (64 hex digits). Short names that are also ID prefixes are checked
    against the image's own tags when it is used."""
    name = text(value).strip()
    if "@" in name or name.lower().startswith("sha256:") or _HEX_ID.fullmatch(name.lower()):
        raise SettingError(f"{name[:80]!r}: a spec names an image by name[:tag] only, never by "
                           "ID or digest (give an ID with --image on the command line)")
    if not _REFERENCE.fullmatch(name):
        raise SettingError(f"{name[:80]!r} is not an image reference name[:tag] (lowercase "
                           "name, optional registry and tag)")
    return name


def text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SettingError("expected a non-empty string")
    if "\0" in value:
        raise SettingError("contains a NUL byte")
    return value


def commands(value: object) -> tuple[str, ...]:
    """One command, or a list of commands run in order."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise SettingError("expected a command (a string) or a non-empty list of commands")
    return tuple(text(item) for item in items)


def patterns(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise SettingError("expected a list of path patterns (strings)")
    return tuple(str(v) for v in value)


def boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise SettingError("expected true or false")
    return value


def choice(*allowed: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in allowed:
            raise SettingError("expected " + " or ".join(f'"{a}"' for a in allowed))
        return str(value)
    return parse


def refused(why: str) -> Callable[[object], Any]:
    def parse(value: object) -> Any:
        raise SettingError(why)
    return parse


@dataclass(frozen=True)
class Setting:
    key: str
    parse: Callable[[object], Any]
    default: Any
    meaning: str
    shown: str = ""  # the default as docs/spec.md shows it


SETTINGS: tuple[Setting, ...] = (
    Setting("image", reference, None, "the sandbox image (ours by default; never pulled unless "
            "--allow-pull)", "retcon-sandbox/base"),
    Setting("build", text, None, "the build command, run by /bin/sh in /workspace", "none"),
    Setting("test", text, None, "the test command", "none"),
    Setting("test_final", text, None, "the test command for the finished branch and `verify`, "
            "when lighter tests run on each commit", "the `test` command"),
    Setting("setup", commands, (), "commands that prepare the environment (the only step with "
            "network: package registries only)", "none"),
    Setting("setup_inputs", patterns, None, "files whose content keys the prepared environment",
            "what setup's commands read when that is known, else the usual manifests and lock "
            "files ([setup.md](setup.md#prepared-once-per-set-of-inputs))"),
    Setting("timeout", number(1, 86_400), 600, "seconds per build or test command", "600"),
    Setting("setup_timeout", number(1, 86_400), 1800, "seconds the whole `setup` may take, "
            "all its commands together", "1800"),
    Setting("memory", size(64 * MIB, 256 * GIB), 2 * GIB, "memory limit (no swap beyond it)",
            "2g"),
    Setting("cpus", number(0.1, 1024), 2.0, "CPU limit", "2"),
    Setting("pids", number(32, 1_000_000, integer=True), 512, "process limit", "512"),
    Setting("workspace_size", size(16 * MIB, 256 * GIB), 2 * GIB,
            "size of the /workspace tmpfs", "2g"),
    Setting("tmp_size", size(16 * MIB, 256 * GIB), 512 * MIB, "size of the /tmp tmpfs", "512m"),
    Setting("max_file_size", size(1 * KIB, 4 * GIB), 100 * MIB,
            "largest file the host reads from the repository or a sandbox", "100m"),
    Setting("git_metadata", boolean, True, "make /workspace a git repository of one commit, so "
            "setuptools-scm and hatch-vcs find a version", "true"),
    Setting("network", choice("none"), "none", "sandboxes are offline; setup's network is "
            "chosen with --setup-network", '"none"'),
    Setting("env", refused("host variables are chosen on the command line only: give "
                           "--pass-env NAME to `execute`"), (), "not a spec setting: see "
            "--pass-env", "-"),
)
BY_KEY = {setting.key: setting for setting in SETTINGS}
# The limits a spec may only lower, each with the command-line option that raises it.
LOWER_ONLY = {"timeout": "--timeout", "setup_timeout": "--setup-timeout", "memory": "--memory",
              "cpus": "--cpus", "pids": "--pids", "workspace_size": "--workspace-size",
              "tmp_size": "--tmp-size"}
SIZES = ("memory", "workspace_size", "tmp_size")
COMMAND_LINE = {"image": text}  # --image may also be an image ID: the user's own choice


def shown(key: str, value: object) -> str:
    """A setting's value as a person writes it."""
    if key in SIZES and isinstance(value, int):
        return human_bytes(value)
    return plain_number(value) if isinstance(value, int | float) else str(value)


def above_default(key: str, value: object) -> str | None:
    """Why a spec's `value` for `key` is refused: a limit it raises above the default."""
    option = LOWER_ONLY.get(key)
    default = BY_KEY[key].default
    if option is None or not isinstance(value, int | float) or value <= default:
        return None
    return (f"{shown(key, value)} is above the default {shown(key, default)}, the most a spec "
            f"may ask for: a spec can only lower this limit. Raise it on the command line "
            f"instead ({option} {shown(key, value)}), up to what the engine has")


@dataclass(frozen=True)
class SandboxSettings:
    image: str | None
    build: str | None
    test: str | None
    test_final: str | None
    setup: tuple[str, ...]
    setup_inputs: tuple[str, ...] | None
    timeout: float
    setup_timeout: float
    memory: int
    cpus: float
    pids: int
    workspace_size: int
    tmp_size: int
    max_file_size: int
    git_metadata: bool
    network: str
    env: tuple[str, ...]

    @classmethod
    def parse(cls, values: dict[str, object]) -> SandboxSettings:
        """From a `[sandbox]` table whose keys are known; raises SettingError(key, message)."""
        parsed = {s.key: s.default for s in SETTINGS}
        for key, value in values.items():
            try:
                parsed[key] = BY_KEY[key].parse(value)
            except SettingError as exc:
                raise SettingError(key, str(exc)) from None
            why = above_default(key, parsed[key])
            if why:
                raise SettingError(key, why)
        return cls(**parsed)

    def replace(self, **overrides: object) -> SandboxSettings:
        """Overrides from the command line, checked like the spec's values."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in overrides.items():
            if value is not None:
                try:
                    values[key] = COMMAND_LINE.get(key, BY_KEY[key].parse)(value)
                except SettingError as exc:
                    raise SettingError(key, str(exc)) from None
        return SandboxSettings(**values)


DEFAULTS = SandboxSettings.parse({})


def final_test(settings: SandboxSettings, test_override: str | None = None) -> str | None:
    """The test command the finished branch and `verify` run: `test_final`, else `test`. A
    `--test` given on the command line is the user's choice for this run and wins."""
    if test_override is not None:
        return settings.test
    return settings.test_final or settings.test
