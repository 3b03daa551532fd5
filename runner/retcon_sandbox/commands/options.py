"""Turning options, the spec and the environment into a repository, a backend and a model."""

from __future__ import annotations

import contextlib
import os
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from retcon_sandbox import progress
from retcon_sandbox.backends.api import Backend
from retcon_sandbox.backends.hostaccess import HostAccess
from retcon_sandbox.errors import (
    GitError,
    ImageError,
    ModelError,
    UsageError,
    env_number,
)
from retcon_sandbox.model.settings import ModelSettings
from retcon_sandbox.pipeline import Pipeline
from retcon_sandbox.repo.gitrepo import Repo
from retcon_sandbox.report import Reporter, verbosity
from retcon_sandbox.spec.file import Spec
from retcon_sandbox.spec.history import Done, next_step
from retcon_sandbox.spec.modeltable import (
    MAX_MODEL_ATTEMPTS,
    MAX_MODEL_SECONDS,
    NO_MODEL,
    ModelTable,
)
from retcon_sandbox.spec.settings import (
    BY_KEY,
    LOWER_ONLY,
    SIZES,
    SandboxSettings,
    SettingError,
    shown,
)
from retcon_sandbox.text import escape_undecodable, sanitize_name, url_problem

NO_ACCESS = HostAccess()
T = TypeVar("T")

if TYPE_CHECKING:
    from retcon_sandbox.backends.docker.backend import DockerBackend
    from retcon_sandbox.backends.docker.endpoints import Endpoint
if TYPE_CHECKING:  # the model's modules (and openai, slow to import) load only when one is named
    from retcon_sandbox.model.agent import Agent


def find_repo(explicit: Path | None, spec_real: Path | None) -> Repo:
    """--repo DIR; else the repository containing the current directory; else the spec's
    (`spec_real`: the spec's real path, None without a spec)."""
    if explicit is not None:
        try:
            return Repo(explicit)
        except GitError:
            raise GitError(f"--repo {explicit}: not a git repository",
                           "Give --repo the repository's directory (or one inside it).") from None
    here = current_directory()
    for place in (here, spec_real.parent if spec_real is not None else None):
        if place is not None:
            with contextlib.suppress(GitError):
                return Repo(place)
    gone = "" if here is not None else " (the current directory no longer exists)"
    nor = ", nor where the spec is" if spec_real is not None else ""
    raise GitError(f"no git repository here{nor}{gone}",
                   "Run retcon-sandbox inside the repository (cd to it again if it was removed "
                   "and made anew), or give --repo DIR.")


def current_directory() -> Path | None:
    """The current directory; None when it was deleted (or can no longer be reached)."""
    try:
        return Path.cwd()
    except OSError:
        return None


@dataclass(frozen=True)
class ModelOptions:
    model: str | None
    base_url: str | None
    timeout: float | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None

    def settings(self, table: ModelTable = NO_MODEL) -> ModelSettings | None:
        """The command line, else the environment, else the spec's `[model]` table."""
        model = self.model or os.environ.get("RETCON_SANDBOX_MODEL") or table.name
        if not model:
            return None
        check_model_name(model, "--model" if self.model else "RETCON_SANDBOX_MODEL")
        base_url = check_base_url(self.base_url)
        api_key = check_api_key(os.environ.get("OPENAI_API_KEY"))
        if not api_key and not base_url:
            raise ModelError("a model is named but OPENAI_API_KEY is not set",
                             "Export OPENAI_API_KEY, or give --base-url for an endpoint that "
                             "needs no key (Ollama, vLLM).")
        attempts = int(env_number("RETCON_SANDBOX_MODEL_ATTEMPTS", 6, integer=True,
                                  maximum=MAX_MODEL_ATTEMPTS))
        max_wait = env_number("RETCON_SANDBOX_MODEL_MAX_WAIT", 20, maximum=MAX_MODEL_SECONDS)
        timeout = self.timeout or env_number("RETCON_SANDBOX_MODEL_TIMEOUT", 120,
                                             maximum=MAX_MODEL_SECONDS)
        deadline = env_number("RETCON_SANDBOX_MODEL_DEADLINE", 600, maximum=MAX_MODEL_SECONDS)
        return ModelSettings(model, base_url, api_key, attempts=attempts, max_wait=max_wait,
                             timeout=timeout, deadline=deadline,
                             temperature=_first(self.temperature, table.temperature),
                             max_tokens=_first(self.max_tokens, table.max_tokens),
                             seed=_first(self.seed, table.seed),
                             stream=os.environ.get("RETCON_SANDBOX_MODEL_STREAM", "").strip()
                             != "0")


def _first(given: T | None, spec: T | None) -> T | None:
    return given if given is not None else spec


def check_base_url(explicit: str | None) -> str | None:
    """--base-url (checked by the parser), else OPENAI_BASE_URL, refused when malformed: an
    empty value is unset."""
    base_url = explicit or os.environ.get("OPENAI_BASE_URL") or None
    problem = url_problem(base_url) if base_url else None
    if base_url and problem:
        raise UsageError(f"OPENAI_BASE_URL='{_shortened(base_url)}' is not an endpoint's base "
                         f"URL: {problem}", "Set it to the API's base URL, such as "
                         "http://localhost:11434/v1, or unset it (OpenAI's own API).")
    return base_url


def _shortened(value: str, limit: int = 120) -> str:
    return sanitize_name(value if len(value) <= limit else value[:limit] + "…")


def check_model_name(model: str, source: str) -> None:
    """A model name goes into every request's JSON: it must be text (UTF-8)."""
    if escape_undecodable(model) != model:
        raise UsageError(f"{source} '{sanitize_name(model)}' is not UTF-8 text",
                         "Give the model's name as the endpoint lists it.")


def check_api_key(key: str | None) -> str | None:
    """OPENAI_API_KEY, refused before any request when no HTTP header could carry it (it is
    sent as `Authorization: Bearer KEY`). The message never shows the key, only where and what
    the wrong character is."""
    for position, char in enumerate(key or "", start=1):
        if not "!" <= char <= "~":
            raise ModelError(
                f"OPENAI_API_KEY cannot be sent: character {position} of {len(key or '')} is "
                f"{_character_kind(char)}", "An API key is printable ASCII with no spaces; copy "
                "it again from your provider (an editor or a shell may have added a quote, a "
                "space or a line break) and export it again.")
    return key


def _character_kind(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape
        return "a byte that is not UTF-8"
    if char in "\r\n":
        return "a line break"
    if char.isspace():
        return f"a space (U+{code:04X})"
    if code < 0x20 or code == 0x7F:
        return f"a control character (U+{code:04X})"
    return f"not ASCII (U+{code:04X}, {unicodedata.name(char, 'unnamed')})"


def _warn(text: str) -> None:
    sys.stderr.write(f"  ⚠ {text}\n")


def make_agent(settings: ModelSettings | None, transcript: Path,
               reporter: Reporter | None = None) -> Agent | None:
    """The model, checked by one preflight request (nothing is written before it answers).
    Each retry is announced on stderr and, for --json, as a `model_retry` event."""
    if settings is None:
        return None
    from retcon_sandbox.model.agent import Agent, StepLimits, Transcript
    from retcon_sandbox.model.llm import OpenAIChat


    def notice(text: str) -> None:
        _warn(text)
        if reporter is not None:
            reporter.emit("model_retry", message=text)

    if looks_like_ollama(settings.base_url):  # on stderr, as the model's other notices
        text = ("this endpoint looks like Ollama, whose default context (2048 to 4096 tokens, "
                "by version) silently truncates long prompts: start it with "
                "OLLAMA_CONTEXT_LENGTH=32768 (or give the model a larger num_ctx in a Modelfile)")
        _warn(text)
        if reporter is not None:  # for --json; a person has just read it on stderr
            reporter.emit("warning", message=text, stderr=True)
    model = OpenAIChat(settings, notice)
    with progress.phase(reporter, "model", what="model preflight"):
        model.preflight()
    return Agent(model, Transcript(transcript), StepLimits(), reporter)


def looks_like_ollama(base_url: str | None) -> bool:
    """Ollama's port, or its native API path."""
    if not base_url:
        return False
    parts = urlsplit(base_url)
    try:
        port = parts.port
    except ValueError:
        return False
    return port == 11434 or parts.path.rstrip("/").endswith("/api") or "/api/" in parts.path


def require_model(spec: Spec, settings: ModelSettings | None) -> None:
    """Stop before doing anything if a pending commit needs a model and none is configured."""
    if settings is not None:
        return
    needing = [c for c in spec.commits
               if c.paths is None and not isinstance(next_step(c.history), Done)]
    if needing:
        names = "\n".join(f"  #{c.number} {c.subject}" for c in needing)
        raise ModelError(
            f"these commits have no `paths` and need a model, but none is configured:\n{names}",
            "Give --model (or RETCON_SANDBOX_MODEL, or `name` in the spec's [model] table) and "
            "OPENAI_API_KEY, plus --base-url (or "
            "OPENAI_BASE_URL) for a non-OpenAI endpoint; or add `paths = [...]` to those commits.")


def sandbox_settings(spec: Spec, image: str | None, build: str | None, test: str | None,
                     timeout: float | None, reporter: Reporter,
                     limits: dict[str, object] | None = None) -> SandboxSettings:
    """The spec's settings with this run's command-line overrides, each one printed.
    `limits`: --memory, --cpus, --pids, --workspace-size, --tmp-size (see `limit_options`)."""
    overrides = {"image": image, "build": build, "test": test, "timeout": timeout,
                 **(limits or {})}
    try:
        settings = spec.sandbox.replace(**overrides)
    except SettingError as exc:
        raise setting_refused(exc) from None
    for key, value in overrides.items():
        if value is not None and value != getattr(spec.sandbox, key):
            reporter.emit("override", key=key, value=value, spec=getattr(spec.sandbox, key))
    return settings


def setting_refused(exc: SettingError) -> UsageError:
    """A command-line override `SandboxSettings.replace` refused (its args: key, message), as
    the usage error naming its option."""
    key, message = exc.args
    return UsageError(f"--{key.replace('_', '-')}: {message}")


def limit_options(args: object) -> dict[str, object]:
    """The resource limits the command line raises (or lowers): the only way above the
    defaults, since a spec can only lower them."""
    return {key: getattr(args, key, None) for key in LOWER_ONLY if key != "timeout"}


def raised_limits(settings: SandboxSettings) -> bool:
    """Whether a limit the engine caps is raised above its default (then `check_engine_limits`
    needs to ask the engine what it has: `docker info`, tens of milliseconds, spared
    otherwise)."""
    return any(getattr(settings, key) > BY_KEY[key].default for key in (*SIZES, "cpus"))


def check_engine_limits(settings: SandboxSettings, memory: int, cpus: int) -> None:
    """A limit raised above its default must fit the engine: memory and the tmpfs sizes (held
    in memory) at most its MemTotal, CPUs at most its NCPU."""
    caps: dict[str, float] = {**dict.fromkeys(SIZES, memory), "cpus": cpus}
    for key, cap in caps.items():
        value = getattr(settings, key)
        if cap > 0 and value > BY_KEY[key].default and value > cap:
            raise UsageError(f"{LOWER_ONLY[key]} {shown(key, value)}: above what the Docker "
                             f"engine has ({shown(key, int(cap))})",
                             f"Give {LOWER_ONLY[key]} at most {shown(key, int(cap))}.")


def make_backend(kind: str, spec: Spec, settings: SandboxSettings,
                 access: HostAccess = NO_ACCESS, spec_image: str | None = None,
                 repo: Repo | None = None, engine_given: Sequence[str] = ()) -> Backend:
    """Where sandboxes run; `access` (from the command line only) is what the host lets in.
    `spec_image`: the image the spec names (no --image), refused when it is an ID prefix or
    another repository's prepared environment (`repo`'s scope is checked). `engine_given`:
    --engine, at most once here (only `verify` spreads its sandboxes over several)."""
    if len(set(engine_given)) > 1:
        raise UsageError(f"--engine is given {len(set(engine_given))} times: this command runs "
                         "one sandbox at a time, on one engine",
                         "Give one --engine; `verify -j N` is the command that spreads its "
                         "sandboxes over several engines.")
    return make_backends(kind, spec, settings, access, spec_image, repo, engine_given)[0]


def make_backends(kind: str, spec: Spec, settings: SandboxSettings,
                  access: HostAccess = NO_ACCESS, spec_image: str | None = None,
                  repo: Repo | None = None, engine_given: Sequence[str] = ()) -> list[Backend]:
    """One backend per engine `--engine` names (or the one of DOCKER_HOST or the docker
    context). The first engine builds or pulls what is missing as usual; every other one must
    already hold the very same image (same ID: a result does not depend on the engine it ran
    on), and it is not built there (a build over a remote link takes minutes): the error says
    how to load it. [sandbox] setup runs on one engine only."""
    if kind == "docker" and len(set(engine_given)) > 1:
        from retcon_sandbox.backends.docker import endpoints

        if settings.setup:
            raise UsageError("[sandbox] setup is not supported with several --engine: each "
                             "engine would prepare an environment of its own",
                             "Give one --engine (or none) for a project with a setup.")
        chosen = endpoints.select_all(engine_given)
        first = _docker_backend(spec, settings, access, spec_image, repo, chosen[0])
        return [first, *(_second_backend(first, endpoint, spec, settings, access)
                         for endpoint in chosen[1:])]
    if kind == "docker":
        from retcon_sandbox.backends.docker import endpoints

        endpoint = endpoints.select(given=engine_given[0]) if engine_given else None
        return [_docker_backend(spec, settings, access, spec_image, repo, endpoint)]
    if engine_given:
        raise UsageError("--engine names a Docker engine: it is not used with --sandbox local",
                         "Drop --engine, or use --sandbox docker.")
    return [_local_backend(kind, access)]


def _local_backend(kind: str, access: HostAccess) -> Backend:
    if kind == "local":
        from retcon_sandbox.backends.local import LocalBackend

        sys.stderr.write("⚠ --sandbox local: builds, tests and file tools run UNSANDBOXED on this "
                         "machine. Use it only for code you trust (and for our own tests).\n")
        return LocalBackend(access.variables)
    raise UsageError(f"unknown sandbox {kind!r} (expected docker or local)")


def _docker_backend(spec: Spec, settings: SandboxSettings, access: HostAccess,
                    spec_image: str | None, repo: Repo | None,
                    endpoint: Endpoint | None) -> DockerBackend:
    from retcon_sandbox.backends.docker import sandboximages
    from retcon_sandbox.backends.docker.backend import DockerBackend
    from retcon_sandbox.backends.docker.engine import DockerEngine

    engine = DockerEngine(endpoint)
    def say(line: str) -> None:
        if verbosity() >= 0:
            print(line, file=sys.stderr)

    if raised_limits(settings):
        check_engine_limits(settings, *engine.resources())
    tag = sandboximages.ensure(engine, settings.image or sandboximages.default_image(), say,
                        allow_pull=access.allow_pull)
    if spec_image is not None and settings.image == spec_image:
        from retcon_sandbox.backends.docker.preparer import check_spec_image, repository_scope

        check_spec_image(engine, tag, repository_scope(repo) if repo is not None else None)
    proxy = None  # setup's egress proxy and the package cache's root containers run from our
    # own base image (never the run's, which a spec names), built before any table
    if settings.setup and (access.setup.network == "registries" or access.setup.package_cache):
        proxy = sandboximages.ensure(engine, sandboximages.default_image(), say)
    return DockerBackend(engine, tag, settings, access.variables,
                         Path(os.path.realpath(spec.path)), proxy)


def _second_backend(first: DockerBackend, endpoint: Endpoint, spec: Spec,
                    settings: SandboxSettings, access: HostAccess) -> DockerBackend:
    """A further engine for `verify`: it must hold the first engine's image, the same one."""
    from retcon_sandbox.backends.docker.backend import DockerBackend
    from retcon_sandbox.backends.docker.engine import DockerEngine

    engine = DockerEngine(endpoint)
    if raised_limits(settings):
        check_engine_limits(settings, *engine.resources())
    tag = first.image
    load = (f"`docker save {tag} | DOCKER_HOST={endpoint.host} docker load` (from the first "
            f"engine), or build it there: `DOCKER_HOST={endpoint.host} retcon-sandbox images "
            "build`")
    if not engine.has_image(tag):
        raise ImageError(f"the engine {endpoint.describe()} has no image {tag}, which "
                         f"--engine {first.engine.endpoint.describe()} runs",
                         f"Load it there: {load}.")
    wanted, found = first.engine.image_id(tag), engine.image_id(tag)
    if wanted != found:
        raise ImageError(f"the engine {endpoint.describe()} has another image under {tag} "
                         f"({found[:19]}) than {first.engine.endpoint.describe()} "
                         f"({wanted[:19]}): results would depend on the engine",
                         f"Give it the same image: {load}.")
    return DockerBackend(engine, tag, settings, access.variables,
                         Path(os.path.realpath(spec.path)), None)


def default_pipeline(kind: str, engine_given: Sequence[str] = ()) -> Pipeline:
    """`execute`'s overlap without --pipeline or --no-pipeline: Pipeline.WARM, but OFF over
    an ssh:// engine, whose sshd allows 10 sessions (MaxSessions) per connection: two
    sandboxes at once can run out of them."""
    if kind != "docker":
        return Pipeline.WARM
    from retcon_sandbox.backends.docker import endpoints

    ssh = any(host.startswith("ssh://") for host in endpoints.hosts(engine_given))
    return Pipeline.OFF if ssh else Pipeline.WARM


def engine_in_use(kind: str, engine_given: Sequence[str] = ()) -> str | None:
    """The Docker engine(s) a run talks to (--engine, DOCKER_HOST, the docker context's, or the
    default socket), for the header and --json; None for the local backend."""
    if kind != "docker":
        return None
    from retcon_sandbox.backends.docker import endpoints

    return endpoints.describe_all(endpoints.select_all(engine_given))
