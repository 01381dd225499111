"""No decode allocates more than its input implies.

A length or count read from the data must never size an allocation the data cannot back: a 5-byte
`int32 0x7fffffff` read as `bytes` used to ask for 2 GiB (`bytes(n)`), and a 22-byte document could
carry a `bytes` field "of" 2,147,483,648 bytes. Checked three ways: a child process whose address
space is capped (an allocation of that size fails there), tracemalloc's peak in process, and
hypothesis over short inputs and every decoder.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rpc
from wire import WireError, WireType, binary, text


class Blob(msgspec.Struct):
    name: str
    data: bytes


class Blobs(msgspec.Struct):
    items: list[bytes]


class BlobCalls(Protocol):
    def blob(self, data: bytes) -> None: ...


INT32_MAX = binary.encode(2**31 - 1)  # a6 ffffff7f: 5 bytes
HUGE_INTS = [2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1]


def hostile_cases() -> list[tuple[str, Callable[[], Any]]]:
    """(name, decode call) pairs whose input names a size far beyond itself."""
    cases: list[tuple[str, Callable[[], Any]]] = []
    for n in HUGE_INTS:
        data = binary.encode(n)
        cases.append((f"bytes from int {n}", lambda d=data: binary.decode(d, bytes)))
        doc = binary.encode_document({"name": "x", "data": n})
        cases.append((f"Blob field from int {n}", lambda d=doc: binary.decode_document(d, Blob)))
        items, blobs = binary.encode([n]), binary.encode({"items": [1, n]})
        cases.append((f"list[bytes] item {n}", lambda d=items: binary.decode(d, list[bytes])))
        cases.append((f"Blobs item {n}", lambda d=blobs: binary.decode(d, Blobs)))
    cases.append(("tuple[bytes, int]", lambda: binary.decode(binary.encode([2**31, 1]), tuple[bytes, int])))
    cases.append(("bytes from bool", lambda: binary.decode(binary.encode(True), bytes)))
    cases.append(("YAML int as bytes", lambda: text.from_yaml("2147483648", bytes)))
    for wire in (WireType.MSGSPEC, WireType.MSGPACK_ARRAY, WireType.FIELDLESS_BINARY):
        for n in HUGE_INTS:
            cases.append((f"{wire.name} int {n} as bytes", lambda w=wire, n=n: w.decode(w.encode(n), bytes)))
    cases.append(("rpc bytes argument", _rpc_bytes_argument))
    return cases


def _rpc_bytes_argument() -> None:
    class Sink(BlobCalls):
        def blob(self, data: bytes) -> None:
            raise AssertionError(f"called with {len(data)} bytes")

    body = bytes(b"\xb9\x04blob" + INT32_MAX)
    rpc.reader(None, Sink()).dispatch(body)


CHILD = textwrap.dedent(
    """
    import resource, sys
    sys.path.insert(0, {root!r})
    from tests.test_wire_bounds import hostile_cases
    from wire import WireError
    cases = hostile_cases()
    # cap the address space at what is mapped now plus 256 MiB: an allocation sized by the data fails
    vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
    for name, call in cases:
        try:
            call()
            print("NO ERROR", name)
        except WireError as e:
            print("ok", name)
        except BaseException as e:
            print(type(e).__name__, name)
    """
)


def test_sizes_from_the_data_allocate_nothing_under_a_capped_address_space():
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", CHILD.format(root=root)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": root})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(hostile_cases())
    assert [line for line in lines if not line.startswith("ok ")] == []


def _peak(call: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        with contextlib.suppress(WireError):
            call()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("n", [1 << 24, 1 << 26])
def test_a_five_byte_int_read_as_bytes_allocates_nothing(n: int):
    data = binary.encode(n)
    assert _peak(lambda: binary.decode(data, bytes)) < 64 << 10
    with pytest.raises(WireError) as info:
        binary.decode(data, bytes)
    assert info.value.offset is not None and 0 <= info.value.offset <= len(data)


def test_bytes_still_read_from_their_own_encodings():
    """What a bytes value legitimately decodes from: its own code, text, a list of byte values."""
    assert binary.decode(binary.encode(b"\x00\xff"), bytes) == b"\x00\xff"
    assert binary.decode(binary.encode("hi"), bytes) == b"hi"
    assert binary.decode(binary.encode([1, 2, 255]), bytes) == b"\x01\x02\xff"
    assert binary.decode(binary.encode(Blob("n", b"abc")), Blob) == Blob("n", b"abc")


TARGETS: list[Any] = [None, bytes, list[bytes], Blob, Blobs, list[int], dict[str, int], str,
                      tuple[bytes, int]]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=24), st.sampled_from(TARGETS))
def test_short_inputs_allocate_in_proportion_to_themselves(data: bytes, target: Any):
    """Whatever 24 bytes say, decoding them stays within a small multiple of their size (objects for
    at most 24 values), for BINARY as a whole value and as a document, and for the msgpack wires."""
    calls: list[Callable[[], Any]] = [lambda: binary.decode(data, target)]
    if target in (Blob, Blobs):
        calls.append(lambda: binary.decode_document(data, target))
    for wire in (WireType.MSGSPEC, WireType.MSGPACK_ARRAY, WireType.FIELDLESS_BINARY):
        calls.append(lambda w=wire: w.decode(data, target))
    for call in calls:
        assert _peak(call) < 256 << 10


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1) | st.booleans())
def test_any_integer_read_where_bytes_are_declared_is_refused(n: int):
    """An integer is no encoding of bytes (it used to be read as that many zero bytes)."""
    for call in (
        lambda: binary.decode(binary.encode(n), bytes),
        lambda: binary.decode(binary.encode([n]), list[bytes]),
        lambda: binary.decode_document(binary.encode_document({"name": "x", "data": n}), Blob),
    ):
        with pytest.raises(WireError) as info:
            call()
        assert info.value.offset is not None
