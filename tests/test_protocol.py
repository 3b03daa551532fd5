"""The helper protocol's dataclasses: one definition for both ends, the wire format as it was,
and every message checked field by field on both sides."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from retcon_sandbox import protocol
from retcon_sandbox.backends.api import HelperSandbox, ToolFailure
from retcon_sandbox.backends.local import LocalBackend
from retcon_sandbox.errors import SandboxError
from retcon_sandbox.protocol import (
    CHECKS,
    ExtractRequest,
    HelloResponse,
    ListRequest,
    ProtocolError,
    ReadRequest,
    ReadResponse,
    RunRequest,
    RunResponse,
    WriteRequest,
    WriteResponse,
    from_wire,
    to_wire,
)
from retcon_sandbox.resources import helper_source

MESSAGES: list[Any] = [
    protocol.HelloRequest(), ExtractRequest(), ExtractRequest(record=True), ReadRequest("a.py"),
    ReadRequest("a.py", 3, 10), WriteRequest("bin/x", "100755", exact=True),
    protocol.DeleteRequest("a.py"), ListRequest(), ListRequest("src"),
    RunRequest("make", 30.5, {"CI": "1"}), RunRequest("true"),
    HelloResponse(10001, "3.11.2", True, False, ["has a network"]),
    protocol.ExtractResponse(12), ReadResponse(True, 3, "a.bin is a binary file"),
    ReadResponse(False, 20, "     1\tx\n", 1, 1, 1, False),
    WriteResponse("updated", "Wrote a.py", 1, 2, "--- a/a.py\n"), WriteResponse("created", "ok"),
    protocol.DeleteResponse("Deleted a.py"), protocol.ListResponse(["a.py", "b/c.py"]),
    RunResponse(0, False, "ok\n", 3, False, 0.25),
    protocol.ExportRequest(1 << 20), protocol.ExportRequest(5, ["a", "b/c"]),
    protocol.ExportResponse(5000), protocol.ResetRequest(), protocol.ResetResponse([]),
    protocol.ResetResponse(["SysV IPC shm: 1 objects (was 0 objects)"]),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_crosses_the_wire_unchanged(message: Any) -> None:
    wire = json.loads(json.dumps(to_wire(message)))
    assert from_wire(type(message), wire) == message


def test_the_wire_format_is_the_one_the_protocol_always_had() -> None:
    assert to_wire(ExtractRequest()) == {}
    assert to_wire(ExtractRequest(record=True)) == {"record": True}
    assert to_wire(ReadRequest("a")) == {"path": "a", "offset": None, "limit": None}
    assert to_wire(ListRequest()) == {"path": None}
    assert to_wire(WriteResponse("created", "Created a")) == {"status": "created",
                                                              "summary": "Created a"}
    assert to_wire(ReadResponse(True, 3, "binary")) == {"binary": True, "size": 3,
                                                        "text": "binary"}


def test_every_field_has_a_check() -> None:
    """A field with an annotation the checks do not know would pass anything."""
    classes = [c for c in vars(protocol).values()
               if isinstance(c, type) and dataclasses.is_dataclass(c)]
    assert len(classes) == 18
    for cls in classes:
        for item in dataclasses.fields(cls):
            assert str(item.type) in CHECKS, f"{cls.__name__}.{item.name}: {item.type}"


@pytest.mark.parametrize(("data", "error"), [
    ({"files": ["a"], "mode": "x"}, "unknown field 'mode'"),
    ({}, "missing field 'files'"),
    ({"files": "a"}, "field 'files' must be list[str], not str"),
    ({"files": ["a", 1]}, "field 'files' must be list[str], not list"),
])
def test_a_message_that_does_not_fit_names_the_field(data: dict[str, Any], error: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(error)):
        from_wire(protocol.ListResponse, data)


def test_numbers_are_checked_strictly() -> None:
    base = {"exit_code": 0, "timed_out": False, "output": "", "total_bytes": 0,
            "truncated": False, "seconds": 1}
    assert from_wire(RunResponse, base).seconds == 1.0  # JSON's 1 for a float
    for name, wrong in [("exit_code", True), ("exit_code", 1.5), ("timed_out", 0),
                        ("seconds", "1"), ("seconds", False)]:
        with pytest.raises(ProtocolError, match=f"field '{name}'"):
            from_wire(RunResponse, {**base, name: wrong})


class Scripted:
    """A transport whose helper answers with the given lines (as if something in the sandbox
    wrote them), each carrying the id of the request it answers."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.sent: list[bytes] = []

    def set_deadline(self, deadline: float | None) -> None:
        pass

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def readline(self) -> bytes:
        request = json.loads(self.sent[-1].split(b"\n", 1)[0])
        return json.dumps({**self.answers.pop(0), "id": request["id"]}).encode() + b"\n"

    def read(self, n: int) -> bytes:
        return b""

    def close(self) -> None:
        pass

    def describe_failure(self) -> str:
        return "scripted"


@pytest.mark.parametrize(("answer", "field"), [
    ({"ok": True, "binary": False, "size": 3, "text": "x", "lines": "many"}, "lines"),
    ({"ok": True, "binary": False, "size": 3, "text": "x", "owner": "root"}, "owner"),
    ({"ok": True, "binary": False, "text": "x"}, "size"),
    ({"ok": True, "binary": "no", "size": 3, "text": "x"}, "binary"),
])
def test_the_host_refuses_an_answer_that_does_not_fit(answer: dict[str, Any],
                                                      field: str) -> None:
    box = HelperSandbox(Scripted(answer))
    with pytest.raises(SandboxError, match=f"answer to `read` does not fit the protocol: "
                       f"(unknown|missing)? ?field '{field}'"):
        box.read_file("a.py")


def test_the_host_sends_requests_built_from_the_dataclasses() -> None:
    transport = Scripted({"ok": True, "status": "created", "summary": "Created a.py"})
    box = HelperSandbox(transport)
    assert box.write_file("a.py", b"data", "100644").summary == "Created a.py"
    assert transport.sent == [b'{"id": 1, "op": "write", "path": "a.py", "mode": "100644", '
                              b'"exact": false, "payload": 4}\ndata']


@pytest.fixture
def box() -> Iterator[HelperSandbox]:
    with LocalBackend().open("test") as sandbox:
        yield sandbox


def test_the_helper_refuses_a_request_that_does_not_fit(box: HelperSandbox) -> None:
    with pytest.raises(ToolFailure, match="bad request: unknown field 'owner'"):
        box.request("list", path=None, owner="root")
    with pytest.raises(ToolFailure, match="bad request: field 'path' must be str, not int"):
        box.request("read", path=5)
    with pytest.raises(ToolFailure, match="bad request: field 'timeout' must be float"):
        box.request("run", cmd="true", timeout="soon")
    assert box.list_files() == []  # still serving


def test_the_shipped_helper_is_one_python_3_8_file_with_one_definition() -> None:
    source = helper_source()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name and name.startswith("retcon_sandbox") for name in imported)
    defined = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert defined.count("ReadRequest") == 1 and "Helper" in defined
    assert source.startswith('"""retcon-sandbox\'s in-container helper.')
