"""Failures are named, never tracebacks: a model that cannot be used is an error (exit 1) that
names the endpoint and the model, found by a preflight before anything is written; only the
model's own `report_stuck` or the loop's budgets make a commit stuck; anything unexpected is an
internal error whose traceback is in a log file."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from retcon_sandbox import __version__, errors
from retcon_sandbox import cli as cli_module
from retcon_sandbox.commands import status as status_command
from retcon_sandbox.model.llm import OpenAIChat, backoff
from retcon_sandbox.model.settings import ModelSettings
from tests.conftest import CLI, NEUTRAL, Demo, cli, git, llm_env, make_demo
from tests.fake_openai import (
    BROKEN_JSON,
    HTML,
    NOT_JSON,
    FakeOpenAI,
    Fault,
    Hang,
    Raw,
    Step,
    call,
    refused_url,
)

LOCAL = ("--sandbox", "local", "--non-interactive")
FAST = {"RETCON_SANDBOX_MODEL_ATTEMPTS": "2"}  # and conftest's RETCON_SANDBOX_MODEL_MAX_WAIT


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def untouched(demo: Demo, spec_before: bytes) -> None:
    assert demo.spec.read_bytes() == spec_before
    assert "feature-clean" not in demo.git("branch", "--list")


# --- 1. a model that cannot be used -----------------------------------------------------------

UNUSABLE: list[tuple[str, Step | None, str, str]] = [
    # name, what the preflight gets (None: nothing listens), message, hint
    ("401", Fault(401, "Incorrect API key provided"), "refused the API key (HTTP 401",
     "Check OPENAI_API_KEY"),
    ("403", Fault(403), "refused the API key (HTTP 403", "Check OPENAI_API_KEY"),
    ("unknown model", "OK", "does not know this model or path (HTTP 404",
     "Check --model (or RETCON_SANDBOX_MODEL)"),
    ("refused", None, "cannot reach the model endpoint after 2 attempts",
     "that the server is running and reachable"),
    ("timeout", Hang(), "did not answer within 0.5 s after 2 attempts",
     "Raise --model-timeout"),
    ("html", HTML, "answered with an HTML page instead of a chat completion",
     "Check --base-url (or OPENAI_BASE_URL): it must be the API's base URL"),
    ("not json", NOT_JSON, "answered with plain text instead of a chat completion: 'OK'",
     "Check --base-url"),
    ("broken json", BROKEN_JSON, "answered with text that is not valid JSON",
     "Check --base-url"),
    ("json, not a completion", Raw('{"status": "ok"}', content_type="application/json"),
     "answered with a chat completion with no choices", "Check --base-url"),
    ("proxy error page", Raw("<html><body>502 Bad Gateway</body></html>", status=502),
     "failed after 2 attempts: HTTP 502", "Check the endpoint's status"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "preflight", "message", "hint"), UNUSABLE,
                         ids=[u[0] for u in UNUSABLE])
def test_an_unusable_model_is_an_error_before_anything_is_written(
        tmp_path: Path, name: str, preflight: Step | None, message: str, hint: str) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    before = demo.spec.read_bytes()
    models = ("another-model",) if name == "unknown model" else None
    with FakeOpenAI([], preflight=preflight or "OK", models=models) as model:
        url = model.base_url if preflight is not None else refused_url()
        result = cli("execute", str(demo.spec), *LOCAL, "--json", "--model-timeout", "0.5",
                     env={**llm_env(url), **FAST})
    assert result.code == 1, result.out + result.err
    assert "Traceback" not in result.err
    assert message in result.err and hint in result.err
    assert f"model 'fake-model' at {url}" in result.err  # the endpoint and the model
    error = events(result.out)[-1]
    assert error["event"] == "error" and error["kind"] == "model" and error["exit_code"] == 1
    assert url in error["message"] and "fake-model" in error["message"] and error["hint"]
    assert {"time", "run"} <= set(error)
    seen = events(result.out)
    timed = [e for e in seen if e["event"] in ("phase_start", "phase_end")]
    assert [(e["event"], e["phase"]) for e in timed] == [("phase_start", "model"),
                                                         ("phase_end", "model")]  # the preflight
    kinds = [e["event"] for e in seen if e not in timed]
    retried = name in ("refused", "timeout", "proxy error page")
    # checked while the first sandbox opened: the model's events come when the run takes its
    # answer, before anything is written (no branch, no entry), and end with the error
    assert kinds == ["spec", "preflight"] + ["model_retry"] * retried + ["error"]
    assert seen.index(timed[0]) > [e["event"] for e in seen].index("preflight")
    untouched(demo, before)


def test_with_a_setup_the_model_is_checked_before_any_sandbox_opens(tmp_path: Path) -> None:
    """The model is checked while the first sandbox opens, unless a setup must run first: that
    can take minutes, and a refused key says so at once, before the preflight begins. (`--sandbox
    local` runs no setup: it would say so when its sandbox opens.)"""
    demo = make_demo(tmp_path / "repo", with_paths=False)
    demo.spec.write_text(demo.spec.read_text().replace("[sandbox]", '[sandbox]\nsetup = "true"'))
    before = demo.spec.read_bytes()
    with FakeOpenAI([], preflight=Fault(401, "Incorrect API key provided")) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--json",
                     env={**llm_env(model.base_url), **FAST})
    assert result.code == 1, result.out + result.err
    assert "refused the API key (HTTP 401" in result.err
    seen = [(e["event"], e.get("phase")) for e in events(result.out)]
    assert seen == [("spec", None), ("phase_start", "model"), ("phase_end", "model"),
                    ("error", None)]  # no `preflight`, no warning that local runs no setup
    untouched(demo, before)


@pytest.mark.slow
@pytest.mark.parametrize("retried", ["refused", "timeout", "proxy error page"])
def test_retries_are_announced(tmp_path: Path, retried: str) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    preflight = {"refused": None, "timeout": Hang(),
                 "proxy error page": Raw("<html>bad gateway</html>", status=502)}[retried]
    with FakeOpenAI([], preflight=preflight or "OK") as model:
        url = model.base_url if preflight is not None else refused_url()
        result = cli("execute", str(demo.spec), *LOCAL,
                     env={**llm_env(url), "RETCON_SANDBOX_MODEL_ATTEMPTS": "3",
                          "RETCON_SANDBOX_MODEL_TIMEOUT": "0.5"})
    why = {"refused": "unreachable", "timeout": "slow (no answer within 0.5 s)",
           "proxy error page": "failing (HTTP 502)"}[retried]
    assert result.code == 1
    assert f"model endpoint {why}, retry 2/3 in 0.0 s…" in result.err
    assert f"model endpoint {why}, retry 3/3 in 0.0 s…" in result.err
    assert "after 3 attempts" in result.err


def test_the_retry_waits_grow_and_are_capped() -> None:
    assert [backoff(n, 20) for n in range(2, 8)] == [1, 2, 4, 8, 16, 20]
    assert [backoff(n, 3) for n in range(2, 5)] == [1, 2, 3]


def test_a_slow_answer_within_the_timeout_is_not_retried() -> None:
    notices: list[str] = []
    with FakeOpenAI(["hello"]) as model:
        chat = OpenAIChat(ModelSettings("fake-model", model.base_url, "key", attempts=2,
                                        timeout=30), notices.append)
        reply = chat.complete([{"role": "user", "content": "hi"}], [])
    assert reply.content == "hello" and notices == []


MID_RUN: list[tuple[str, Step, str]] = [
    ("401", Fault(401), "refused the API key (HTTP 401"),
    ("html", HTML, "answered with an HTML page"),
    ("timeout", Hang(), "did not answer within 0.5 s after 2 attempts"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "fault", "message"), MID_RUN, ids=[m[0] for m in MID_RUN])
def test_a_model_failing_mid_run_is_an_error_and_never_stuck(tmp_path: Path, name: str,
                                                             fault: Step, message: str) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI([[call("read_diff")], fault, fault]) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--json", "--model-timeout", "0.5",
                     env={**llm_env(model.base_url), **FAST})
    assert result.code == 1, result.out + result.err
    assert message in result.err and "Traceback" not in result.err
    assert events(result.out)[-1]["kind"] == "model"
    retries = [e for e in events(result.out) if e["event"] == "model_retry"]
    assert len(retries) == (1 if name == "timeout" else 0)
    assert all("retry 2/2" in e["message"] for e in retries)
    text = demo.spec.read_text()
    assert "stuck" not in text and text.count('"started"') == 1  # the run resumes from here


@pytest.mark.slow
def test_only_report_stuck_makes_a_commit_stuck(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=False)
    with FakeOpenAI([[call("report_stuck", summary="the hints contradict the diff")]]) as model:
        result = cli("execute", str(demo.spec), *LOCAL, "--json", env=llm_env(model.base_url))
    assert result.code == 3, result.out + result.err
    assert '{ stuck = "the hints contradict the diff" }' in demo.spec.read_text()
    error = events(result.out)[-1]
    assert error["event"] == "error" and error["kind"] == "stuck" and error["exit_code"] == 3


# --- 2. no tracebacks -------------------------------------------------------------------------


def test_an_unexpected_error_names_its_log_file(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    """A bug of ours, provoked: the real CLI's handler, in this process, over a command whose
    spec reader fails in a way nothing expects."""
    def broken(path: Path) -> None:
        raise KeyError("an assumption that failed")

    monkeypatch.setattr(status_command, "load", broken)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(SystemExit) as info:
        cli_module.main(["status", str(tmp_path / "spec.toml"), "--json"])
    out, err = capsys.readouterr()
    assert info.value.code == 1
    assert "internal error: KeyError: 'an assumption that failed'" in err
    assert "This is a bug in retcon-sandbox, not in your input" in err
    logs = list((tmp_path / "state" / "retcon-sandbox").glob("crash-*.log"))
    assert len(logs) == 1 and str(logs[0]) in err
    log = logs[0].read_text()
    head, _, trace = log.partition("\n\n")
    assert trace.startswith("Traceback") and "in broken" in trace and "Traceback" not in err
    assert head.splitlines() == [
        f"retcon-sandbox {__version__}",
        f"Python {platform.python_version()} ({platform.python_implementation()})",
        f"platform {platform.platform()}",
        subprocess.run(["git", "version"], capture_output=True, text=True).stdout.strip(),
        head.splitlines()[-1]]
    assert head.splitlines()[-1].startswith("Docker engine not reachable (")
    error = json.loads(out.splitlines()[-1])
    assert error["event"] == "error" and error["kind"] == "internal" and str(logs[0]) in \
        error["hint"]
    assert {"time", "run"} <= set(error)


def test_a_crash_log_keeps_its_traceback_when_the_versions_fail(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_versions() -> str:
        raise OSError("no such thing")

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    try:
        raise ValueError("the bug")
    except ValueError as exc:
        error = errors.internal_error(exc, no_versions)
    (log,) = (tmp_path / "state" / "retcon-sandbox").glob("crash-*.log")
    assert str(log) in error.hint
    text = log.read_text()
    assert text.startswith("(versions unavailable: OSError: no such thing)\n\nTraceback")
    assert "ValueError: the bug" in text


@pytest.mark.parametrize(("args", "code", "message"), [
    (("execute", "/nonexistent-dir/sub/spec.toml", "--sandbox", "local"), 1,
     "the directory /nonexistent-dir/sub does not exist"),
    (("status", "/nonexistent-dir/sub/spec.toml"), 1,
     "the directory /nonexistent-dir/sub does not exist"),
    (("status", "{tmp}"), 1, "is a directory, not a spec file"),
    (("status", "{tmp}/missing.toml"), 1, "missing.toml: no such file"),
    (("status", "{tmp}/latin1.toml"), 1, "latin1.toml: not UTF-8 text (byte 13)"),
    (("status", "{tmp}/broken.toml"), 1, "broken.toml: not valid TOML"),
    (("execute", "{tmp}/broken.toml", "--timeout", "nan"), 2,
     "argument --timeout: expected a number greater than 0, got 'nan'"),
    (("execute", "{spec}", "--repo", "{tmp}", "--sandbox", "local"), 1,
     ": not a git repository"),
    (("execute",), 2, "the following arguments are required: SPEC"),
    (("frobnicate",), 2, "invalid choice: 'frobnicate'"),
])
def test_bad_invocations_get_a_message_not_a_traceback(demo: Demo, tmp_path: Path,
                                                       args: tuple[str, ...], code: int,
                                                       message: str) -> None:
    (tmp_path / "latin1.toml").write_bytes('source = "caf\u00e9"\n'.encode("latin-1"))
    (tmp_path / "broken.toml").write_text("source = \n")
    filled = [a.format(tmp=tmp_path, spec=demo.spec) for a in args]
    result = cli(*filled)
    assert result.code == code, result.out + result.err
    assert message in result.err and "Traceback" not in result.err


def closed_stdout(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with a standard output nobody reads (`retcon-sandbox ... | head -0`)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*CLI, *args], cwd=NEUTRAL, stdout=write, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True, timeout=300)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [("status", "{spec}"), ("status", "{spec}", "--json"),
                                  ("prompt",), ("--version",), ("execute", "-h")])
def test_a_closed_stdout_is_no_traceback(demo: Demo, args: tuple[str, ...]) -> None:
    proc = closed_stdout(*(a.format(spec=demo.spec) for a in args))
    assert proc.returncode == 1 and proc.stderr == ""


@pytest.mark.slow
def test_a_run_whose_stdout_closes_stops_quietly_and_resumes(demo: Demo) -> None:
    before = demo.spec.read_bytes()
    proc = closed_stdout("execute", str(demo.spec), *LOCAL, "--json")
    assert proc.returncode == 1
    assert "standard output was closed" in proc.stderr and "Traceback" not in proc.stderr
    assert demo.spec.read_bytes() == before  # the first event comes before any write
    again = cli("execute", str(demo.spec), *LOCAL)
    assert again.code == 0, again.out + again.err


def test_sigterm_before_the_run_is_an_interrupted_event(demo: Demo) -> None:
    with FakeOpenAI([], preflight=Hang()) as model:
        proc = subprocess.Popen([*CLI, "execute", str(demo.spec), *LOCAL, "--json"], cwd=NEUTRAL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **llm_env(model.base_url)})
        deadline = time.monotonic() + 60
        while model.preflights == 0 and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.05)
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    error = events(out)[-1]
    assert error["kind"] == "interrupted" and error["exit_code"] == 130
    assert "✗ interrupted: every finished step is saved" in err and "Traceback" not in err
    assert "feature-clean" not in git(demo.path, "branch", "--list")


def test_a_lock_file_that_is_not_a_file_is_named(demo: Demo) -> None:
    first = cli("execute", str(demo.spec), *LOCAL, env={"RETCON_SANDBOX_MODEL": "m"})
    assert first.code == 1 and "OPENAI_API_KEY is not set" in first.err  # after the lock
    state = demo.path / ".git" / "retcon-sandbox"
    (lock,) = state.glob("*.lock")
    lock.unlink()
    lock.mkdir()
    result = cli("execute", str(demo.spec), *LOCAL)
    assert result.code == 1, result.out + result.err
    assert f"cannot open the lock file {lock}: Is a directory" in result.err
    assert f"rm -r {lock}" in result.err and "Traceback" not in result.err


def test_repo_option_naming_no_repository(demo: Demo, tmp_path: Path) -> None:
    result = cli("execute", str(demo.spec), *LOCAL, "--repo", str(tmp_path / "nowhere"))
    assert result.code == 1
    assert f"--repo {tmp_path / 'nowhere'}: not a git repository" in result.err
