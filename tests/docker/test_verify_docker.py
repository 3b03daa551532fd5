"""The verification cache and `verify`, with every build and test in real containers."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.engine import DockerEngine
from tests.conftest import CLI, cli, git, make_demo
from tests.docker.conftest import ours

DOCKER = ("--non-interactive",)


def events(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def preflights(out: str) -> list[object]:
    """Whether each preflight of a run (`--json` on stdout) opened a sandbox."""
    return [e["sandbox"] for e in map(json.loads, out.splitlines()) if e["event"] == "preflight"]


def test_cached_trees_need_no_container_and_verify_runs_n_at_a_time(engine: DockerEngine,
                                                                    tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "repo", with_paths=True)
    original = demo.spec.read_text()
    first = cli("execute", str(demo.spec), *DOCKER, "--json")
    found = events(first.out)
    assert first.code == 0 and len([e for e in found if e["event"] == "sandbox"]) == 4, \
        first.out + first.err
    assert preflights(first.out) == [True]

    # a redo: the same trees, so no build, no test, no container: not even the preflight's,
    # whose check passed in this environment before, nor the base's check
    demo.git("branch", "-D", "feature-clean")
    demo.spec.write_text(original)
    redo = cli("execute", str(demo.spec), *DOCKER, "--json")
    assert redo.code == 0, redo.out + redo.err
    found = events(redo.out)
    assert not [e for e in found if e["event"] in ("sandbox", "base_check")], redo.out
    assert len([e for e in found if e["event"] in ("build", "tests") and e.get("cached")]) == 8
    assert preflights(redo.out) == [False]

    # the environment is the image's ID (what the tag names today), then the setup's key
    cached = cli("verify", str(demo.spec), "--json")
    assert cached.code == 0, cached.err
    start = events(cached.out)[0]
    image_id = engine.client.images.get(sandboximages.default_image()).id
    assert start["event"] == "verify_start"
    assert re.fullmatch(f"docker {image_id} setup:[0-9a-f]{{16}}", str(start["environment"]))
    assert all(e["cached"] for e in events(cached.out) if e["event"] == "commit_verified")

    again = cli("verify", str(demo.spec), "--no-cache", "-j", "2", "--json")
    assert again.code == 0, again.err
    verified = [e for e in events(again.out) if e["event"] == "commit_verified"]
    assert len(verified) == 4 and not any(e["cached"] for e in verified)
    assert all(e["build"] == "PASS" and e["tests"] == "PASS" for e in verified)

    messy = cli("verify", "main..feature", "--spec", str(demo.spec), "-j", "2", cwd=demo.path)
    assert messy.code == 3, messy.out + messy.err
    assert "10 commits: 8 passed, 2 failed" in messy.out
    assert "SyntaxError" in messy.out and "KeyError: 'SUMMER25'" in messy.out


def test_forged_notes_pass_nothing_in_verify_or_execute(engine: DockerEngine,
                                                        tmp_path: Path) -> None:
    """Whoever can push refs/notes/retcon-sandbox claims a pass for every tree of the
    reconstruction, under the exact cache key; the test command fails everywhere. verify and
    execute run the trees again and fail; only --trust-notes believes the claim."""
    from retcon_sandbox.repo.gitrepo import Repo
    from retcon_sandbox.userkey import UserKey
    from retcon_sandbox.verify.cache import Cache, Key, Outcome, Stage

    demo = make_demo(tmp_path / "repo", with_paths=True)
    original = demo.spec.read_text()
    local = cli("execute", str(demo.spec), "--sandbox", "local", "--non-interactive")
    assert local.code == 0, local.out + local.err
    trees = demo.git("log", "--format=%T", "main..feature-clean").split()
    tip = demo.git("rev-parse", "feature-clean")
    demo.git("branch", "-D", "feature-clean")
    demo.spec.write_text(original)
    demo.git("update-ref", "-d", "refs/notes/retcon-sandbox")

    first = cli("verify", tip, "--spec", str(demo.spec), "--test", "false", "--json")
    assert first.code == 3, first.out + first.err
    [start] = [e for e in events(first.out) if e["event"] == "verify_start"]
    environment = str(start["environment"])
    key = Key("python3 -m compileall -q shop tests", "false", environment)
    forger = Cache(Repo(demo.path), key=UserKey(b"a key that is not the user's", "forger"))

    def forge() -> None:
        for tree in trees:
            forger.put(tree, key, Outcome((Stage("build", key.build or "", "PASS", True, False,
                                                 0.1),
                                           Stage("test", "false", "PASS", True, False, 0.1)),
                                          None, "", 600))

    forge()
    again = cli("verify", tip, "--spec", str(demo.spec), "--test", "false", "--json")
    assert again.code == 3, again.out
    [row] = [e for e in events(again.out) if e["event"] == "commit_verified"]
    assert row["passed"] is False and row["cached"] is False
    assert row["claimed_by_others"] == {"passed": True, "build": "PASS", "tests": "PASS",
                                        "trusted": False}

    forge()
    shipped = cli("execute", str(demo.spec), "--test", "false", "--json", *DOCKER)
    assert shipped.code != 0, shipped.out
    found = events(shipped.out)
    assert [e["verdict"] for e in found if e["event"] == "tests"][:1] == ["FAIL (exit 1)"]
    assert not [e for e in found if e["event"] == "summary" and e.get("complete")]

    forge()
    trusted = cli("verify", tip, "--spec", str(demo.spec), "--test", "false", "--trust-notes")
    assert trusted.code == 0, trusted.out + trusted.err
    assert "trusted (--trust-notes), not run" in trusted.out


def test_passed_variables_reach_the_key_by_hmac_only(engine: DockerEngine, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    from retcon_sandbox.backends.docker.backend import DockerBackend
    from retcon_sandbox.spec.settings import DEFAULTS

    def environment(env: dict[str, str]) -> str:
        return DockerBackend(engine, sandboximages.default_image(), DEFAULTS, env,
                             tmp_path / "spec.toml").environment()

    passed = {"TOKEN": "1234"}
    monkeypatch.setenv("RETCON_SANDBOX_NOTES_KEY", "9c4e1f7a0b3d8e25c6f14a9b7d02e8c3f5a1b6d4")
    first = environment(passed)
    assert first.startswith(f"docker {engine.image_id(sandboximages.default_image())} env:")
    plain = hashlib.sha256(json.dumps(passed, sort_keys=True).encode()).hexdigest()
    assert plain[:16] not in first
    assert environment({"TOKEN": "1235"}) != first
    monkeypatch.setenv("RETCON_SANDBOX_NOTES_KEY", "3e8b5a1f9d2c7e04b6a83f1d5c9e27b0a4d6f8c1")
    assert environment(passed) != first


def test_ctrl_c_during_verify_j_leaves_no_sandbox(engine: DockerEngine, tmp_path: Path) -> None:
    """verify -j 2 opens the next sandboxes ahead while two commands run: Ctrl-C removes every
    one of them, those still being opened too."""
    demo = make_demo(tmp_path / "repo", with_paths=True)
    proc = subprocess.Popen([*CLI, "verify", "main..feature", "--test", "sleep 120", "-j", "2",
                             "--no-cache"], cwd=demo.path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(ours(engine, tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)  # two running, the next ones being opened
    assert len(ours(engine, tmp_path)) >= 3, "the look-ahead opened no further sandbox"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not ours(engine, tmp_path)


# Each tree's test first fails if anything an earlier tree left is there, then leaves all it
# can: files in hidden directories (/tmp, /dev/shm, the workspace, .git), a POSIX message
# queue, a detached process holding an unnamed file in /tmp, a TCP port closed by the server's
# side first; with "ipc", a SysV segment, with "flowlabel", an IPv6 flow label that lingers; with
# "shared", only files the helper's uid may remove.
LEAVE_BEHIND = r'''
import ctypes, os, socket, subprocess, sys
found = [os.path.join(d, n) for d in ("/tmp", "/dev/shm", "/dev/mqueue") for n in os.listdir(d)]
found += sorted(set(os.listdir(".")) - {".git", "leave.py", "n.txt"})
found += [p for p in os.listdir("/proc") if p.isdigit()
          and b"retcon-leftover" in open(f"/proc/{p}/cmdline", "rb").read()]
found += ["a SysV segment"] * (len(open("/proc/sysvipc/shm").read().splitlines()) - 1)
found += ["a flow label"] * (len(open("/proc/net/ip6_flowlabel").read().splitlines()) - 1)
found += [".git/" + n for n in os.listdir(".git") if n.startswith("leftover")]
found += os.listxattr("/workspace")
found += ["a socket"] * (len(open("/proc/net/tcp").read().splitlines()) - 1)
try:  # as an honest server would (no SO_REUSEADDR)
    socket.create_server(("127.0.0.1", 8000)).close()
except OSError as exc:
    found.append(f"port 8000: {exc}")
if found:
    sys.exit(f"an earlier tree left: {found}")
if "shared" in sys.argv:  # only what the helper's uid may remove: group-writable, in the workspace
    os.makedirs("junk/deeper")
    open("junk/deeper/file", "w").write("x" * 100000)
    sys.exit(0)
for top in ("/tmp/hidden/deep", "/dev/shm/hidden/deep", "junk/deeper"):
    os.makedirs(top)
    open(top + "/file", "w").write("x" * 100000)
    os.chmod(os.path.dirname(top), 0)
open(".git/leftover", "w").write("x")
server = socket.create_server(("127.0.0.1", 8000))  # closed by its side first: TIME_WAIT
client = socket.create_connection(("127.0.0.1", 8000))
server.accept()[0].close()
os.setxattr("/workspace", "user.leftover", b"x" * 4000)  # on its root, which a wipe keeps
libc = ctypes.CDLL(None, use_errno=True)
mq_open = getattr(libc, "mq_open", None) or ctypes.CDLL("librt.so.1").mq_open
assert mq_open(b"/leftover", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0
if "ipc" in sys.argv:
    assert libc.shmget(0, 4096, 0o1000 | 0o600) >= 0
if "flowlabel" in sys.argv:  # an IPv6 flow label that lingers 150 s after its socket
    labels = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    labels.setsockopt(socket.IPPROTO_IPV6, 32, socket.inet_pton(socket.AF_INET6, "::1")
                      + (1).to_bytes(4, "big") + bytes([0, 1]) + (3).to_bytes(2, "little")
                      + (150).to_bytes(2, "little") * 2 + bytes(4))
subprocess.Popen([sys.executable, "-c", "import os, time; fd = os.open('/tmp', os.O_TMPFILE | "
                  "os.O_RDWR); os.write(fd, b'x' * 100000); time.sleep(1000)", "retcon-leftover"],
                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
'''


def _leaving_project(path: Path, trees: int) -> Path:
    from retcon_sandbox.repo.gitrepo import Repo

    repo = Repo.init(path, "main")
    repo.commit_files("main", {"leave.py": LEAVE_BEHIND, "n.txt": "0\n"}, "base")
    for k in range(1, trees + 1):
        repo.commit_files("main", {"n.txt": f"{k}\n"}, f"tree {k}")
    return path


def _verified(path: Path, trees: int, test: str, *extra: str
              ) -> tuple[list[dict[str, object]], dict[str, Any]]:
    result = cli("verify", f"main~{trees}..main", "--test", test, "-j", "1", "--no-cache",
                 "--json", *extra, cwd=path)
    assert result.code == 0, result.out + result.err
    found = events(result.out)
    phases = next(e for e in found if e["event"] == "verify_phases")
    assert isinstance(phases["counts"], dict)
    return found, phases["counts"]


def test_a_reused_sandbox_holds_nothing_of_the_trees_before_it(engine: DockerEngine,
                                                               tmp_path: Path) -> None:
    """Five trees, one worker: two containers (the next one is made ready while a tree runs),
    each wiped and reused in turn. Every tree finds none of what the others left."""
    path = _leaving_project(tmp_path / "repo", 5)
    found, counts = _verified(path, 5, "python3 leave.py")
    verified = [e for e in found if e["event"] == "commit_verified"]
    assert [e["tests"] for e in verified] == ["PASS"] * 5, [e["tail"] for e in verified]
    assert counts["create"] == 2 and counts["reused"] == 3
    assert counts["wipe_exec"] == 3  # what it hid needs the commands' uid to remove
    assert not [e for e in found if e["event"] == "sandbox_not_reused"]

    found, counts = _verified(path, 5, "python3 leave.py shared")
    assert [e["tests"] for e in found if e["event"] == "commit_verified"] == ["PASS"] * 5
    assert counts["reused"] == 3 and "wipe_exec" not in counts  # the helper removed it alone
    assert not ours(engine, tmp_path)


@pytest.mark.parametrize(("leave", "left"), [
    ("ipc", "SysV IPC shm: 1 objects (was 0 objects)"),
    ("flowlabel", "/proc/net/ip6_flowlabel: 2 lines (was 1 lines)")])
def test_a_sandbox_that_is_not_as_new_is_replaced(engine: DockerEngine, tmp_path: Path,
                                                  leave: str, left: str) -> None:
    """A SysV IPC object, or an IPv6 flow label, outlives its processes and the wipe does not
    remove it: that sandbox is removed and a fresh one opened, so the next tree does not see it
    either. --no-reuse opens a fresh one for every tree."""
    path = _leaving_project(tmp_path / "repo", 4)
    found, counts = _verified(path, 4, f"python3 leave.py {leave}")
    verified = [e for e in found if e["event"] == "commit_verified"]
    assert [e["tests"] for e in verified] == ["PASS"] * 4, [e["tail"] for e in verified]
    assert counts["create"] == 4 and "reused" not in counts
    refused = [e for e in found if e["event"] == "sandbox_not_reused"]
    # trees 3 and 4 (1 and 2 ran in fresh containers anyway); on a loaded machine, a tree's
    # sandbox may be made ready only once the tree before it is done, and then both the used
    # containers are tried (and refused) for it
    assert len(refused) >= 2
    assert all(e["left"] == [left] for e in refused), refused
    assert not ours(engine, tmp_path)
    if leave == "ipc":
        found, counts = _verified(path, 4, "python3 leave.py", "--no-reuse")
        assert counts["create"] == 4 and counts["wipe"] == 0 and "reused" not in counts



SHOW_GIT = ("git describe --tags --long; test -z \"$(git status --porcelain)\" && echo clean; "
            "stat -c %u .git; umask; cat n.txt; exit 1")


@pytest.mark.parametrize("where", ["command", "exec"])
def test_the_git_metadata_is_the_same_made_in_the_first_commands_exec(
        engine: DockerEngine, tmp_path: Path, where: str) -> None:
    """Whether the git metadata is made in an exec of its own or in the tree's first command's
    (RETCON_SANDBOX_VERIFY_PREPARE; by default the latter when the workers take every core),
    each tree's command sees the same repository: its tag's distance, a clean status, owned by
    the commands' uid; with the same umask. When it cannot be made (no room left for git's
    objects), the command runs all the same, and a warning says why (in the command's exec,
    its output says so first too)."""
    from retcon_sandbox.repo.gitrepo import Repo

    path = tmp_path / "repo"
    repo = Repo.init(path, "main")
    repo.commit_files("main", {"n.txt": "0\n"}, "base")
    git(path, "tag", "v2.0")
    for k in (1, 2, 3):
        repo.commit_files("main", {"n.txt": f"{k}\n"}, f"tree {k}")
    env = {"RETCON_SANDBOX_VERIFY_PREPARE": where}
    result = cli("verify", "main~3..main", "--test", SHOW_GIT, "-j", "2", "--no-cache",
                 "--json", cwd=path, env=env)
    assert result.code == 3, result.out + result.err
    found = events(result.out)
    assert next(e for e in found if e["event"] == "verify_phases")["prepare"] == where
    tails = sorted(str(e["tail"]) for e in found if e["event"] == "commit_verified")
    for k, tail in zip((1, 2, 3), tails, strict=True):
        described, *rest = tail.split()
        assert described.startswith(f"v2.0-{k}-g"), tails
        assert rest == ["clean", "10002", "0002", str(k)], tails
    assert not ours(engine, tmp_path)

    # no room for git's objects: the tree's 12 MB file (9 MB compressed) in a 16 MB workspace
    repo.commit_files("main", {"big.txt": base64.b64encode(os.urandom(9 << 20)).decode()},
                      "big")
    full = cli("verify", "main~1..main", "--test", "echo ran; exit 1", "--workspace-size", "16m",
               "-j", "2", "--no-cache", "--json", cwd=path, env=env)
    assert full.code == 3, full.out + full.err
    found = events(full.out)
    tail = str(next(e for e in found if e["event"] == "commit_verified")["tail"])
    said = "the workspace could not be made a git repository"
    assert tail.rstrip().endswith("ran"), tail
    warnings = [str(e["message"]) for e in found if e["event"] == "warning"]
    assert len(warnings) == 1 and said in warnings[0], found  # with git's reason
    assert "No space left on device" in warnings[0] or "write error" in warnings[0], warnings
    if where == "command":  # and first in the command's output
        assert f"retcon-sandbox: {said} (exit " in tail, tail
    assert not ours(engine, tmp_path)


PLANTED_GIT = """#!/bin/sh
echo "planted git $*" >> /tmp/planted-git.log
kill -INT $PPID
exec /usr/bin/git "$@"
"""


def test_the_git_metadata_is_made_by_the_systems_git_not_one_a_setup_planted(
        engine: DockerEngine, tmp_path: Path) -> None:
    """A setup may write the virtual environment first on the image's PATH (the commands' uid
    owns it): a `git` it plants there is never the one that makes a tree's git metadata. This
    one would interrupt the supervisor that then runs the tree's command (in the same exec)."""
    from retcon_sandbox.repo.gitrepo import Repo

    path = tmp_path / "repo"
    repo = Repo.init(path, "main")
    repo.commit_files("main", {"plant": PLANTED_GIT, "n.txt": "0\n"}, "base")
    git(path, "tag", "v3.0")
    for k in (1, 2):
        repo.commit_files("main", {"n.txt": f"{k}\n"}, f"tree {k}")
    spec = tmp_path / "spec.toml"
    spec.write_text('source = "main"\nremote = "main"\ncleaned = "c"\n[sandbox]\n'
                    'setup = ["install -m755 plant /opt/venv/bin/git"]\n'
                    "test = 'test ! -e /tmp/planted-git.log && /usr/bin/git describe --tags'\n"
                    '[[commit]]\nmessage = "x"\nhints = "y"\n')
    result = cli("verify", "main~2..main", "--spec", str(spec), "-j", "2", "--no-cache",
                 "--setup-network", "none", "--json", cwd=path,
                 env={"RETCON_SANDBOX_VERIFY_PREPARE": "command"})
    found = events(result.out)
    for tag in {str(e["tag"]) for e in found if e["event"] == "setup_ready"}:
        engine.remove_image(tag)  # the environment it prepared: no other test uses it
    assert result.code == 0, result.out + result.err
    assert [e["tests"] for e in found if e["event"] == "commit_verified"] == ["PASS"] * 2
    assert not [e for e in found if e["event"] == "warning"], found
    assert not ours(engine, tmp_path)
