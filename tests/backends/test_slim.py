"""A bootstrapped root filesystem leaves out what debian:bookworm-slim leaves out."""

from __future__ import annotations

import hashlib
from pathlib import Path

from retcon_sandbox.backends.docker import sandboximages


def write(root: Path, path: str, text: str = "x\n") -> Path:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def test_documents_manuals_and_translations_go_and_copyrights_stay(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    for path in ("usr/share/doc/git/README.md", "usr/share/doc/git/contrib/hooks/x.sh",
                 "usr/share/doc/git/copyright", "usr/share/man/man1/git.1.gz",
                 "usr/share/info/dir", "usr/share/locale/de/LC_MESSAGES/git.mo",
                 "usr/share/locale/locale.alias", "usr/share/zoneinfo/UTC",
                 "usr/share/lintian/overrides/git", "etc/kept"):
        write(root, path)
    (root / "usr/share/doc/python3").symlink_to("../../../etc", target_is_directory=True)
    (root / "usr/share/man/man1/python3.1.gz").symlink_to("../../../../etc/kept")
    outside = write(tmp_path, "outside/groff.tmac")
    (root / "usr/share/groff").symlink_to(outside.parent, target_is_directory=True)
    beyond = write(tmp_path, "beyond/overrides/git")
    (root / "usr/share/lintian").rename(tmp_path / "unused")
    (root / "usr/share/lintian").symlink_to(beyond.parent.parent, target_is_directory=True)

    sandboximages.slim(root)

    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert outside.exists() and beyond.exists()  # a folder through a link out: left alone
    assert left == ["etc/dpkg/dpkg.cfg.d/retcon-sandbox-slim", "etc/kept",
                    "usr/share/doc/git/copyright", "usr/share/locale/locale.alias",
                    "usr/share/zoneinfo/UTC"]
    assert (root / "etc/kept").read_text() == "x\n"  # links were removed, not followed
    for folder in ("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info"):
        assert (root / folder).is_dir()  # as dpkg leaves them: the folders stay
    assert not (root / "usr/share/man/man1").exists()  # emptied folders below them go
    config = (root / "etc/dpkg/dpkg.cfg.d/retcon-sandbox-slim").read_text()
    assert "path-exclude /usr/share/man/*\n" in config  # what apt-get installs later is slim too


def test_the_bootstrapped_base_is_tagged_by_what_leaves_it_slim() -> None:
    """An image bootstrapped before the rootfs was slim is not reused for a slim one."""
    packages_alone = hashlib.sha256(sandboximages.ROOTFS_PACKAGES.encode()).hexdigest()[:8]
    assert not sandboximages.rootfs_tag().endswith(packages_alone)
    assert sandboximages.SLIM in sandboximages.ROOTFS  # the base image's tag covers it too
