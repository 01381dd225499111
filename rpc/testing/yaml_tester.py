"""YamlTester: YAML call scenarios in, YAML calls out, through the real encode/dispatch path.

A scenario folder holds `in.yaml` (method calls, one YAML document per input message), the expected
`out.yaml` (the calls the component made on its output, one document per output message) and
optionally `setup.yaml` (calls replayed first, outputs discarded). Inputs go through the real path:
each call is encoded as a BINARY method document and dispatched by a `MethodReader`, so argument
conversion is what production does; outputs are the BINARY documents the component's method writers
produce, rendered back to YAML.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpc import _codec
from rpc._reader import MethodReader
from wire import binary, text

__all__ = [
    "Recorder",
    "ReplayResult",
    "YamlTester",
    "decode_call",
    "encode_call",
    "read_calls",
    "render_calls",
]

HandlerFactory = Callable[["Recorder"], object]


class Recorder:
    """An output for writers that keeps every document in memory instead of appending to a queue."""

    source_id = 0

    def __init__(self) -> None:
        self.documents: list[bytes] = []
        self.enabled = True

    def write(self, data: Any) -> int:
        if self.enabled:
            self.documents.append(bytes(data))
        return len(self.documents) - 1


def read_calls(yaml_text: str) -> list[dict[str, Any]]:
    """The YAML documents of a scenario file: each a mapping of event name to argument value."""
    docs = text.from_yaml_all(yaml_text)
    for doc in docs:
        if not isinstance(doc, dict):
            raise ValueError(f"a scenario document must be a mapping of method: argument, got {doc!r}")
    return docs


def encode_call(doc: dict[str, Any]) -> bytes:
    """One YAML call document as the BINARY method document a Java or Python writer would append."""
    out = bytearray()
    for key, value in doc.items():
        event: str | int = int(key) if isinstance(key, str) and key.isdigit() else key
        out += _codec.event_bytes(event)
        out += binary.encode(value)
    return bytes(out)


def decode_call(document: bytes) -> dict[str, Any]:
    """A BINARY method document (history dropped) as {event: generic argument value}."""
    _, pos = _codec.read_history(document)
    doc: dict[str, Any] = {}
    while True:
        event, pos = _codec.event_at(document, pos)
        if event is None:
            return doc
        r = _codec.reader_at(document, pos)
        doc[str(event)] = r.read_value()
        pos = r.position


def render_calls(docs: Sequence[dict[str, Any]], comments: Sequence[str | None] = ()) -> str:
    """YAML text of call documents, `---` after each; a comment before a document where given."""
    parts = []
    for i, doc in enumerate(docs):
        comment = comments[i] if i < len(comments) else None
        if comment:
            parts.append(f"# {comment}\n")
        body = text.to_yaml(doc)
        parts.append(body if body.endswith("\n") else body + "\n")
        parts.append("---\n")
    return "".join(parts)


@dataclass
class ReplayResult:
    expected: list[dict[str, Any]]
    actual: list[dict[str, Any]]
    actual_yaml: str
    created: bool = False  # out.yaml did not exist and was written from this run

    @property
    def passed(self) -> bool:
        return self.expected == self.actual and not self.created

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                render_calls(self.expected).splitlines(True),
                render_calls(self.actual).splitlines(True),
                "out.yaml (expected)",
                "actual",
            )
        )


class YamlTester:
    """Replays YAML call scenarios through a component built by `handler_factory(output)`.

    `handler_factory` receives the output (a `Recorder`) to build its `rpc.writer`s on, exactly as a
    `rpc.Service` factory receives the real output queue. As in production, inputs call only methods
    of the Protocols the handler declares or of `interfaces`; any other name is an unknown event.
    """

    def __init__(self, handler_factory: HandlerFactory, *, interfaces: Sequence[type] = ()) -> None:
        self.handler_factory = handler_factory
        self.interfaces = tuple(interfaces)

    def replay(
        self, inputs: Sequence[dict[str, Any]], setup: Sequence[dict[str, Any]] = ()
    ) -> tuple[list[dict[str, Any]], list[str | None]]:
        """The output calls the component makes for `inputs` (after a silent `setup`), with comments
        naming the input message each output answered."""
        out = Recorder()
        handler = self.handler_factory(out)
        reader = MethodReader(None, handler, interfaces=self.interfaces, source_id=0)
        out.enabled = False
        for doc in setup:
            reader.dispatch(encode_call(doc))
        out.enabled = True
        comments: list[str | None] = []
        for n, doc in enumerate(inputs, 1):
            before = len(out.documents)
            reader.dispatch(encode_call(doc))
            made = len(out.documents) - before
            comments += [f"input {n}: {', '.join(doc)}"] + [None] * (made - 1) if made else []
        return [decode_call(d) for d in out.documents], comments

    def run(self, folder: str | Path, *, regenerate: bool = False) -> ReplayResult:
        """Replay `folder`'s scenario; with `regenerate`, rewrite its `out.yaml` from what happened.

        A missing `out.yaml` is written from this run too, but the result does not pass: an expectation
        nobody has reviewed is not one."""
        folder = Path(folder)
        setup_file = folder / "setup.yaml"
        setup = read_calls(setup_file.read_text()) if setup_file.exists() else []
        actual, comments = self.replay(read_calls((folder / "in.yaml").read_text()), setup)
        actual_yaml = render_calls(actual, comments)
        out_file = folder / "out.yaml"
        created = not out_file.exists()
        if regenerate or created:
            out_file.write_text(actual_yaml)
        expected = read_calls(out_file.read_text())
        return ReplayResult(expected, actual, actual_yaml, created and not regenerate)

    def check(self, folder: str | Path, *, regenerate: bool = False) -> None:
        """`run`, raising AssertionError with a unified diff when the outputs differ from out.yaml."""
        result = self.run(folder, regenerate=regenerate)
        if result.created:
            raise AssertionError(f"{folder}/out.yaml was missing: written from this run, review it")
        if not result.passed:
            raise AssertionError(f"replay of {folder} differs from its out.yaml:\n{result.diff()}")
