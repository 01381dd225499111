"""Bad documents never crash a reader: random and mutated bodies raise WireError or are skipped."""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rpc
from rpc.testing import Recorder
from tests.rpc_support import Events, Message1, Message2, Recording
from tests.test_rpc_writer import java_calls
from wire import WireError


def _documents() -> list[bytes]:
    out = Recorder()
    java_calls(rpc.writer(out, Events))
    rpc.writer(out, Events, source_id=9, clock=lambda: 12345).method2(Message2(1, 2.5, False))
    rpc.writer(out, Events).method1(Message1("ü" * 40))
    return out.documents


DOCS = _documents()


def _dispatch(body: bytes) -> None:
    unknown: list[object] = []
    r = rpc.MethodReader(None, Recording(), interfaces=[Events], source_id=1,
                         on_unknown=lambda e, i: unknown.append(e))
    with contextlib.suppress(WireError):  # the only exception bad input may raise
        r.dispatch(body, 7)
    assert rpc.current_history() is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(DOCS), st.data())
def test_mutated_documents_raise_only_wire_error(doc, data):
    body = bytearray(doc)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
        if op == "flip" and body:
            i = data.draw(st.integers(0, len(body) - 1))
            body[i] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del body[data.draw(st.integers(0, len(body))) :]
        else:
            i = data.draw(st.integers(0, len(body)))
            body[i:i] = data.draw(st.binary(min_size=1, max_size=4))
    _dispatch(bytes(body))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_raise_only_wire_error(body):
    _dispatch(body)
