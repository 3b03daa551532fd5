"""The state machine, without I/O: what a commit needs next, from its history alone."""

from retcon_sandbox.spec.history import (
    PROVENANCE_PREFIX,
    Blocked,
    CommitCreated,
    Complete,
    Done,
    Entry,
    Extract,
    Fresh,
    Resolved,
    Response,
    Started,
    Stuck,
    Verify,
    next_step,
    provenance_release,
)

A, B = "a" * 40, "b" * 40


def test_empty_history_is_fresh() -> None:
    assert next_step([]) == Fresh()


def test_started_without_commit_is_an_interrupted_extraction() -> None:
    assert next_step([Started()]) == Extract(None, None, interrupted=True)


def test_trailing_commit_created_is_reverified_not_redone() -> None:
    assert next_step([Started(), CommitCreated(A)]) == Verify(A, None, None, interrupted=True)


def test_complete_is_done_even_with_later_responses() -> None:
    assert next_step([Started(), CommitCreated(A), Complete()]) == Done()
    assert next_step([Started(), CommitCreated(A), Complete(), Response("x")]) == Done()


def test_stuck_without_resolution_blocks() -> None:
    assert next_step([Started(), CommitCreated(A), Stuck("cycle")]) == Blocked("cycle")


def test_resolved_retries_the_fix_loop_with_the_note() -> None:
    history: list[Entry] = [Started(), CommitCreated(A), Stuck("cycle"), Resolved("merged 3 and 4")]
    assert next_step(history) == Verify(A, "merged 3 and 4", "cycle", interrupted=False)


def test_resolved_without_any_commit_retries_extraction() -> None:
    history: list[Entry] = [Started(), Stuck("unclear hints"), Resolved("hints fixed")]
    assert next_step(history) == Extract("hints fixed", "unclear hints", interrupted=False)


def test_response_written_ahead_resolves_the_next_stuck_only() -> None:
    ahead: list[Entry] = [Response("use the helper"), Started(), Stuck("missing helper")]
    assert next_step(ahead) == Extract("use the helper", "missing helper", interrupted=False)
    used_up: list[Entry] = [*ahead, CommitCreated(A), Stuck("again")]
    assert next_step(used_up) == Blocked("again")


def test_response_after_stuck_resolves_it() -> None:
    history: list[Entry] = [Started(), CommitCreated(A), Stuck("s"), Response("go on")]
    assert next_step(history) == Verify(A, "go on", "s", interrupted=False)


def test_a_response_alone_does_not_start_anything() -> None:
    assert next_step([Response("later")]) == Fresh()


def test_fix_commits_after_resolution_keep_the_note_and_verify_the_newest() -> None:
    history: list[Entry] = [Started(), CommitCreated(A), Stuck("s"), Resolved("r"),
                            CommitCreated(B)]
    assert next_step(history) == Verify(B, "r", "s", interrupted=True)


def test_a_provenance_stop_is_resolved_by_a_human_only() -> None:
    stop = Stuck(f"{PROVENANCE_PREFIX} --strict-provenance: 1 path(s) ...")
    ahead: list[Entry] = [Started(), Response("go on"), CommitCreated(A), stop]
    assert next_step(ahead) == Blocked(stop.summary)
    assert next_step([Started(), CommitCreated(A), stop, Response("go on")]) == \
        Blocked(stop.summary)
    assert provenance_release([*ahead, Response("go on")]) is None
    released: list[Entry] = [*ahead, Resolved("checked")]
    assert next_step(released) == Verify(A, "checked", stop.summary, interrupted=False)
    assert provenance_release(released) == "checked"
    # a commit made after the human looked is content nobody has seen yet
    assert provenance_release([*released, CommitCreated(B)]) is None
    # a `resolved` of an earlier stop, or of another kind of stop, releases nothing
    assert provenance_release([Started(), Stuck("cycle"), Resolved("x"), CommitCreated(A),
                               stop]) is None
    assert provenance_release([Started(), CommitCreated(A), Stuck("cycle"),
                               Resolved("x")]) is None
