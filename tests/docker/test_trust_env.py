"""Issue 19 on a real engine: prepared environments never cross repositories (item 2), a spec
can only lower limits (item 6), setup's disk is capped and old environments pruned (item 7),
and the helper's tree list is its own (item 9)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from retcon_sandbox.backends.docker import sandboximages
from retcon_sandbox.backends.docker.backend import DockerBackend
from retcon_sandbox.backends.docker.engine import DockerEngine
from retcon_sandbox.backends.docker.preparer import repository_scope
from retcon_sandbox.backends.docker.sandboximages import LABEL_ENV_SCOPE
from retcon_sandbox.backends.envkeys import scope_digest
from retcon_sandbox.repo.gitrepo import Repo
from tests.conftest import cli
from tests.docker.conftest import build_test_image
from tests.docker.test_setup import RUN, events, make_project, prepared

MADE: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def remove_prepared(engine: DockerEngine) -> Iterator[None]:
    yield
    for tag in MADE:
        engine.remove_image(tag)


def run(spec: Path, *extra: str) -> tuple[int, list[dict[str, object]], str]:
    result = cli("execute", str(spec), "--json", "--non-interactive", "--setup-network", "none",
                 *extra, timeout=900)
    found = events(result.out)
    MADE.extend(prepared(found))
    return result.code, found, result.out + result.err


def project(root: Path, sandbox: str) -> Path:
    """Two commits; the second changes requirements.txt, an input: two environments."""
    base = {"requirements.txt": f"# {RUN} {root.name}\n",
            "test_a.py": "def test_a():\n    pass\n"}
    feature = {"requirements.txt": f"# {RUN} {root.name} two\n", "a.py": "A = 1\n",
               "b.py": "B = 2\n"}
    return make_project(root, base, feature, sandbox, ["a.py"], ["requirements.txt", "b.py"])


def error_of(found: list[dict[str, object]]) -> dict[str, object]:
    return next(e for e in found if e["event"] == "error")


# -- item 2: prepared environments never cross repositories ----------------------------------


def test_a_spec_cannot_use_another_repositorys_environment(engine: DockerEngine,
                                                           tmp_path: Path) -> None:
    private = project(tmp_path / "private", 'setup = "echo private-token > /var/tmp/secret"\n'
                      'test = "python -m pytest -q"')
    code, found, log = run(private)
    assert code == 0, log
    tag = prepared(found)[-1]
    labels = engine.image_labels(tag)
    assert labels[LABEL_ENV_SCOPE] == scope_digest(repository_scope(Repo(private.parent)))
    image_id = engine.image_id(tag).removeprefix("sha256:")
    for name, why in ((tag, "a prepared environment of another repository"),
                      (image_id[:12], "takes it as an image ID prefix")):
        thief = project(tmp_path / f"thief-{len(why)}",
                        f'image = "{name}"\ntest = "cat /var/tmp/secret && exit 1"')
        code, found, log = run(thief)
        assert code == 1, log
        assert why in str(error_of(found)["message"]), log
        assert "private-token" not in log
        assert not [e for e in found if e["event"] in ("tests", "build", "setup")], log


def test_a_spec_image_by_id_is_refused_and_the_command_line_may_give_one(
        engine: DockerEngine, tmp_path: Path) -> None:
    base_id = engine.image_id(sandboximages.default_image())
    spec = project(tmp_path / "by-id", f'image = "{base_id}"\ntest = "true"')
    code, _, log = run(spec)
    assert code == 1 and "never by ID or digest" in log, log
    spec.write_text(spec.read_text().replace(f'image = "{base_id}"\n', ""))
    code, _, log = run(spec, "--image", base_id)
    assert code == 0, log


# -- item 6: a spec can only lower limits ----------------------------------------------------


def test_a_spec_cannot_raise_limits_and_the_command_line_is_capped(engine: DockerEngine,
                                                                   tmp_path: Path) -> None:
    spec = project(tmp_path / "limits", 'test = "python -m pytest -q"\nmemory = "256g"\n'
                   'pids = 1000000')
    code, found, log = run(spec)
    assert code == 1, log
    assert "memory: 256g is above the default 2g" in log and "--memory 256g" in log, log
    spec.write_text(spec.read_text().replace('memory = "256g"\npids = 1000000', 'pids = 64'))
    memory, cpus = engine.resources()
    too_much = f"{memory // 1024**3 + 64}g"
    code, found, log = run(spec, "--memory", too_much)
    assert code == 2 and f"--memory {too_much}: above what the Docker engine has" in log, log
    code, found, log = run(spec, "--cpus", str(cpus + 1))
    assert code == 2 and "--cpus" in log, log
    code, found, log = run(spec, "--memory", "3g")  # raised from the command line: it holds
    assert code == 0, log
    sandbox = str(next(e for e in found if e["event"] == "spec")["sandbox"])
    assert "memory 3g, pids 64" in sandbox, sandbox


def test_the_raised_limits_reach_the_container(engine: DockerEngine, tmp_path: Path) -> None:
    from retcon_sandbox.spec.settings import DEFAULTS

    settings = DEFAULTS.replace(memory="3g", pids=2048)
    backend = DockerBackend(engine, sandboximages.default_image(), settings, {},
                            tmp_path / "s.toml")
    with backend.open("limits") as box:
        config = engine.client.api.inspect_container(box.container_id)["HostConfig"]
    assert (config["Memory"], config["PidsLimit"]) == (3 * 1024**3, 2048)


# -- item 7: setup's disk is capped, old environments pruned ---------------------------------


def test_a_setup_that_writes_too_much_keeps_nothing(engine: DockerEngine,
                                                    tmp_path: Path) -> None:
    spec = project(tmp_path / "big", 'setup = "head -c 30000000 /dev/urandom > /var/tmp/big"\n'
                   'test = "python -m pytest -q"')
    scope = scope_digest(repository_scope(Repo(spec.parent)))
    code, found, log = run(spec, "--setup-disk", "10m")
    assert code == 1, log
    error = error_of(found)
    assert error["kind"] == "setup" and "over --setup-disk 10m" in str(error["message"]), log
    assert not prepared(found) and not engine.images_labelled(LABEL_ENV_SCOPE, scope)
    code, found, log = run(spec, "--setup-disk", "1g")
    assert code == 0, log
    disk = [e for e in found if e["event"] == "setup_disk"]
    assert disk and all(int(str(e["written"])) >= 30_000_000 for e in disk), disk


@pytest.mark.parametrize("hide", ["", " && chmod 000 /var/tmp/many",
                                  " && ln -s /bin/true /opt/venv/bin/find"],
                         ids=["open", "hidden", "a find of its own first on PATH"])
def test_a_setup_that_writes_too_many_files_keeps_nothing(engine: DockerEngine,
                                                          tmp_path: Path, hide: str) -> None:
    """6000 empty files take no bytes, but inodes: --setup-disk 20m allows 5120 files, counted
    before the setup is committed, so nothing is kept: in the container, or by the engine when
    setup made a folder of its files that it cannot read. The count runs the system's `find`,
    never one setup put first on PATH (the image's venv is the commands')."""
    spec = project(tmp_path / "many", 'setup = "mkdir /var/tmp/many && cd /var/tmp/many && '
                   f'seq 6000 | xargs touch{hide}"\ntest = "python -m pytest -q"')
    scope = scope_digest(repository_scope(Repo(spec.parent)))
    code, found, log = run(spec, "--setup-disk", "20m")
    assert code == 1, log
    error = error_of(found)
    assert error["kind"] == "setup" and "files, over the 5120 that --setup-disk 20m allows" \
        in str(error["message"]), log
    assert not prepared(found) and not engine.images_labelled(LABEL_ENV_SCOPE, scope)


def test_setups_files_are_counted_from_the_containers_clock(backend: DockerBackend) -> None:
    """What `_within_files` counts, without the engine's walk of the image: the files of the
    commands' uid whose inode changed after the clock was read, with the system's `find`."""
    with backend.open_setup("t", "none", (), None) as box:
        since = box.clock(30)
        assert since is not None and float(since) > 1.7e9
        assert box.run("mkdir /opt/venv/many && cd /opt/venv/many && touch a b c", 30).passed
        assert box.owned_files(since, 120) == 5  # the folder, its files, and /opt/venv's entry
        assert box.run("ln -s /bin/true /opt/venv/bin/find", 30).passed
        assert box.owned_files(since, 120) == 7  # the link and bin/, counted by /usr/bin/find
        assert box.owned_files(box.clock(30) or "", 120) == 0
        assert box.owned_files("0; touch /opt/venv/x", 120) is None
        assert box.owned_files("99999999999999999999.000000000", 120) is None
        assert box.owned_files("١٢٣٤٥٦٧٨٩٠.١٢٣٤٥٦٧٨٩", 120) is None


def test_what_no_walk_can_list_leaves_the_count_to_the_engine(backend: DockerBackend) -> None:
    """A folder of theirs that they cannot list, made before the clock was read: what they
    write below it changes nothing the walk sees, so the count refuses to say a number."""
    with backend.open_setup("t", "none", (), None) as box:
        made = box.run("mkdir -p /opt/venv/old/open && chmod 777 /opt/venv/old/open && "
                       "chmod 300 /opt/venv/old", 30)
        assert made.passed, made.output
        since = box.clock(30)
        assert since is not None
        assert box.run("cd /opt/venv/old/open && seq 50 | xargs touch", 30).passed
        assert box.owned_files(since, 120) is None


def test_a_folder_of_the_image_they_can_write_but_not_list_fails_the_count(
        engine: DockerEngine, backend: DockerBackend) -> None:
    """/var/drop is root's, mode 1733 (as PHP's sessions folder): files can be made in it
    that no walk lists, so the count refuses to say a number, and the engine's is asked."""
    tag = "retcon-sandbox-test/drop-folder:1"
    build_test_image(engine, tag, f"FROM {backend.image}\nRUN mkdir -m 1733 /var/drop\n")
    try:
        image = DockerBackend(engine, tag, backend.settings, {}, Path(backend.spec_path))
        with image.open_setup("t", "none", (), None) as box:
            since = box.clock(30)
            assert since is not None
            assert box.run("cd /var/drop && seq 50 | xargs touch", 30).passed
            assert box.owned_files(since, 120) is None
    finally:
        engine.remove_image(tag)


def test_the_count_loads_no_library_the_images_env_names(engine: DockerEngine,
                                                        backend: DockerBackend) -> None:
    """An image whose ENV preloads a library from a folder setup may write: the count's tools
    load none (here the loader would say it cannot preload it, and the count be no number)."""
    tag = "retcon-sandbox-test/preload:1"
    build_test_image(engine, tag, f"FROM {backend.image}\nENV LD_PRELOAD=/opt/venv/lib/x.so\n")
    try:
        image = DockerBackend(engine, tag, backend.settings, {}, Path(backend.spec_path))
        with image.open_setup("t", "none", (), None) as box:
            assert "cannot be preloaded" in box.run("true", 30).output
            since = box.clock(30)
            assert since is not None
            assert box.run("touch /opt/venv/made", 30).passed
            assert box.owned_files(since, 120) == 2  # the file, and /opt/venv's new entry
    finally:
        engine.remove_image(tag)


HIDDEN = "d=$PIP_CACHE_DIR/hidden; mkdir -p $d && cd $d && "  # then unreadable to others
SIZED = {  # what setup leaves in the package cache; --setup-disk 20m allows 5120 files
    "30 MB": "head -c 30000000 /dev/urandom > big && chmod 000 $d",
    "30 MB, failing": "head -c 30000000 /dev/urandom > big && chmod 000 $d; exit 3",
    "1 MB, 30 hard links": "head -c 1000000 /dev/urandom > f && "
                           "for i in $(seq 30); do ln f l$i; done && chmod 000 $d",
    "6000 empty files": "seq 6000 | xargs touch && chmod 000 $d"}


@pytest.mark.parametrize("left", SIZED, ids=list(SIZED))
def test_a_package_cache_over_the_cap_is_removed_though_setup_hid_its_files(
        engine: DockerEngine, tmp_path: Path, left: str) -> None:
    """Setup fills the package cache past --setup-disk, in a directory it then makes
    unreadable: the measure still counts it (hard links in full, files as well as bytes), and
    the cache goes, whether setup then passes (its environment, small, is kept) or fails (a
    failure is no way around the cap)."""
    spec = project(tmp_path / "cache", f'setup = "{HIDDEN}{SIZED[left]}"\n'
                   'test = "python -m pytest -q"')
    code, found, log = run(spec, "--setup-disk", "20m")
    volumes = {str(e["cache"]) for e in found if e["event"] == "setup" and e.get("cache")}
    failing = "failing" in left
    try:
        assert code == (1 if failing else 0), log
        measured = [e for e in found if e["event"] == "setup_cache_disk"]
        assert len(measured) == 1, log
        used, files = int(str(measured[0]["used"])), int(str(measured[0]["files"]))
        assert used >= 30_000_000 or files >= 6000, measured
        warnings = [str(e["message"]) for e in found if e["event"] == "warning"]
        assert [w for w in warnings if ("over --setup-disk 20m" in w or "over the 5120" in w)
                and "it was removed" in w], warnings
        assert len(volumes) == 1 and not engine.has_volume(next(iter(volumes))), log
        assert len(prepared(found)) == (0 if failing else 1)
    finally:
        for name in volumes:
            engine.remove_volume(name)


def test_the_oldest_environments_beyond_the_limit_are_pruned(engine: DockerEngine,
                                                             tmp_path: Path) -> None:
    spec = project(tmp_path / "prune", 'setup = "cat requirements.txt; echo one > /var/tmp/one"'
                   '\ntest = "python -m pytest -q"')  # setup reads requirements.txt: an input
    scope = scope_digest(repository_scope(Repo(spec.parent)))
    code, found, log = run(spec, "--keep-environments", "1")
    assert code == 0, log
    first = prepared(found)
    assert len(first) == 2 and all(engine.has_image(t) for t in first), log  # both in use
    spec.write_text(spec.read_text().replace("echo one", "echo two"))
    result = cli("verify", str(spec), "--json", "--setup-network", "none",
                 "--keep-environments", "1", "--no-cache", cwd=spec.parent, timeout=900)
    second = prepared(events(result.out))
    MADE.extend(second)
    assert result.code == 0, result.out + result.err
    assert len(second) == 2, result.out
    assert not any(engine.has_image(t) for t in first), result.out  # the older run's: pruned
    assert all(engine.has_image(t) for t in second)
    pruned = [str(e["tag"]) for e in events(result.out) if e["event"] == "setup_pruned"]
    assert sorted(pruned) == sorted(first), result.out
    assert len(engine.images_labelled(LABEL_ENV_SCOPE, scope)) == 2


# -- item 9: the helper's tree list ----------------------------------------------------------


def test_the_tree_list_is_the_helpers_own(backend: DockerBackend, tmp_path: Path) -> None:
    repo_dir = tmp_path / "r"
    spec = project(repo_dir, 'test = "true"')
    repo = Repo(spec.parent)
    with backend.open_setup("setup", "none", (), None) as box:
        box.load_tree(repo.tree_tar(repo.tree_of("main"), 1 << 20), record=True)
        shown = box.run("stat -c '%a %u' /tmp/retcon-tree-files", 30)
        assert shown.output.strip() == "600 10001", shown.output
        rewrite = box.run("printf '' > /tmp/retcon-tree-files", 30)
        assert not rewrite.passed, rewrite.output  # the commands' uid cannot change it
        box.run("echo made > /workspace/made.txt", 30)
        kept = box.snapshot()
        assert kept.passed and "kept 1 files" in kept.output, kept.output
