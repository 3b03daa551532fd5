"""A repository's own configuration starts no program on the host, even for what only reads
its history: with `log.showSignature` set, `git log` (and `reflog show`) would verify each
signed commit with the program `gpg.program` names."""

from __future__ import annotations

import subprocess
from pathlib import Path

from retcon_sandbox.repo.gitrepo import Repo

SIGNED = ("tree {tree}\nparent {parent}\nauthor A <a@example.com> 1700000000 +0000\n"
          "committer A <a@example.com> 1700000000 +0000\n"
          "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n"
          " -----END PGP SIGNATURE-----\n\nsigned: a subject\n\nand a body\n")


def git(repo: Path, *args: str, data: bytes | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], input=data, check=True,
                          capture_output=True).stdout.decode().strip()


def hostile(tmp_path: Path) -> tuple[Repo, str, Path]:
    """A repository whose branch `main` ends in a signed commit, configured to verify
    signatures in `log` with a program that leaves a marker."""
    path, marker = tmp_path / "repo", tmp_path / "ran"
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    git(path, "-c", "user.name=A", "-c", "user.email=a@example.com", "commit", "-q",
        "--allow-empty", "-m", "base")
    text = SIGNED.format(tree=git(path, "rev-parse", "HEAD^{tree}"),
                         parent=git(path, "rev-parse", "HEAD"))
    signed = git(path, "hash-object", "-t", "commit", "-w", "--stdin", data=text.encode())
    git(path, "update-ref", "-m", "signed", "refs/heads/main", signed)
    program = tmp_path / "verify"
    program.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 1\n")
    program.chmod(0o755)
    for key in ("gpg.program", "gpg.openpgp.program", "gpg.ssh.program", "gpg.x509.program"):
        git(path, "config", key, str(program))
    git(path, "config", "log.showSignature", "true")
    git(path, "log", "-1", "--format=%s", signed)  # git itself runs it here:
    assert marker.exists()  # the setting works, and this test could fail
    marker.unlink()
    return Repo(path), signed, marker


def test_reading_a_signed_history_runs_no_verifying_program(tmp_path: Path) -> None:
    repo, signed, marker = hostile(tmp_path)
    base = repo.parent_of(signed)
    assert base is not None
    assert repo.message_of(signed) == "signed: a subject\n\nand a body"
    assert repo.subjects("main", 5) == ["signed: a subject", "base"]
    assert [s for _, s in repo.log(base, signed)] == ["signed: a subject"]
    assert [c[0] for c in repo.commits_in(signed, base)] == [signed]
    assert [sha for sha, _ in repo.reflog("main")][-1] == signed
    assert not marker.exists(), marker.read_text()
