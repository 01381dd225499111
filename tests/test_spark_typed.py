"""Typed argument columns (option ``interface``) and typed documents (option ``type``) through real Spark.

The Protocol and DTOs below are what the source imports by name (``tests.test_spark_typed:Trades``),
so Spark's Python workers import this module too.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import attrs
import msgspec
import pytest

import chronq
import rpc
import wire
from chronq.errors import ChronqError
from chronq.spark import _typed
from tests.spark_support import spark_session

pytestmark = pytest.mark.spark

SPEC = "tests.test_spark_typed:Trades"


class Side(enum.Enum):
    BUY = 1
    SELL = 2


@attrs.define
class Venue:
    name: str
    mic: str | None = None


@dataclasses.dataclass
class Fill:
    qty: int
    price: float


class Trade(msgspec.Struct):
    timestamp: int
    symbol: str
    price: float
    qty: int
    side: Side
    venue: Venue
    fills: list[Fill] = []
    tags: dict[str, int] = {}
    at: dt.datetime | None = None
    day: dt.date | None = None
    notional: Decimal = Decimal(0)
    raw: bytes = b""
    live: bool = True


class Trades(Protocol):
    def trade(self, t: Trade) -> None: ...
    def cancel(self, order_id: int, reason: str) -> None: ...
    def heartbeat(self) -> None: ...


class Others(Protocol):
    def quote(self, symbol: str) -> None: ...


class TradeV2(Trade):
    """Trade as a newer writer sends it: one more field, last."""

    trader: str = ""


class TradesV2(Protocol):
    def trade(self, t: TradeV2) -> None: ...


def sample(i: int) -> Trade:
    return Trade(
        timestamp=1_700_000_000_000_000_000 + i,
        symbol=f"SYM{i}",
        price=1.5 + i,
        qty=-i if i % 2 else i,
        side=Side.SELL if i % 2 else Side.BUY,
        venue=Venue("LSE", "XLON" if i % 3 else None),
        fills=[Fill(j, 0.25 * j) for j in range(i % 3)],
        tags={"desk": i} if i % 2 else {},
        at=dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC) if i % 2 else None,
        day=dt.date(2024, 5, i % 28 + 1),
        notional=Decimal(f"1234567890123456789{i % 10}.123456789"),
        raw=bytes([i % 256, 0, 255]),
        live=i % 2 == 0,
    )


def as_row(t: Trade) -> dict[str, Any]:
    """What Spark's Row gives for a Trade: the documented mapping, done by hand."""
    return {
        "timestamp": t.timestamp, "symbol": t.symbol, "price": t.price, "qty": t.qty, "side": t.side.name,
        "venue": {"name": t.venue.name, "mic": t.venue.mic},
        "fills": [{"qty": f.qty, "price": f.price} for f in t.fills],
        "tags": dict(t.tags), "day": t.day,
        "at": None if t.at is None else t.at.astimezone().replace(tzinfo=None),  # collect(): local, naive
        "notional": str(t.notional), "raw": t.raw,
        "live": t.live,
    }


@pytest.fixture(scope="module")
def spark() -> Any:
    return spark_session()


def load(spark: Any, path: Path, **options: str) -> Any:
    reader = spark.read.format("chronq")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(str(path))


def rows_by_seq(df: Any) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in df.orderBy("seq").collect()]


# --------------------------------------------------------------------------------------------- mapping


def test_spark_types_of_annotations() -> None:
    ddl = _typed.interface_columns(SPEC).ddl
    assert ddl.startswith("struct<`trade`: struct<`t`: struct<`timestamp`: bigint, `symbol`: string, ")
    assert "`side`: string, `venue`: struct<`name`: string, `mic`: string>" in ddl
    assert "`fills`: array<struct<`qty`: bigint, `price`: double>>, `tags`: map<string, bigint>" in ddl
    assert "`at`: timestamp, `day`: date, `notional`: string, `raw`: binary, `live`: boolean" in ddl
    assert ddl.endswith("`cancel`: struct<`order_id`: bigint, `reason`: string>, `heartbeat`: struct<>>")
    assert _typed.spark_type(tuple[int, str])[0] == "struct<`_1`: bigint, `_2`: string>"
    assert _typed.spark_type(Any)[0] == "string"  # no faithful Spark type: JSON text


@dataclasses.dataclass
class _Late:
    qty: int
    filled: int = dataclasses.field(init=False, default=0)


def test_struct_columns_hold_every_field_the_wire_carries() -> None:
    """An init=False field is on the wire (see docs/wire.md, Fields), so it is a column too."""
    ddl, convert = _typed.spark_type(_Late)
    assert ddl == "struct<`qty`: bigint, `filled`: bigint>"
    late = _Late(3)
    late.filled = 2
    assert convert is not None and convert(wire.binary.decode(wire.binary.encode(late), type=_Late)) == {
        "qty": 3,
        "filled": 2,
    }


def test_interface_spec_errors_name_the_problem() -> None:
    with pytest.raises(ChronqError, match="expected 'module:QualName'"):
        _typed.load("tests.test_spark_typed.Trades", "interface")
    with pytest.raises(ChronqError, match="cannot import module 'no_such_module_x'"):
        _typed.load("no_such_module_x:Trades", "interface")
    with pytest.raises(ChronqError, match="has no 'Nope'"):
        _typed.load("tests.test_spark_typed:Nope", "interface")
    with pytest.raises(ChronqError, match=r"is not a typing\.Protocol"):
        _typed.interface_columns("tests.test_spark_typed:Trade")
    with pytest.raises(ChronqError, match="is not a msgspec Struct"):
        _typed.document_column("tests.test_spark_typed:Trades")


# --------------------------------------------------------------------------------------------- reads


def test_typed_args_round_trip(spark: Any, tmp_path: Path) -> None:
    trades = [sample(i) for i in range(40)]
    with chronq.open(tmp_path / "q") as q:
        w = rpc.writer(q, Trades)
        for i, t in enumerate(trades):
            w.trade(t)
            if i % 10 == 0:
                w.cancel(i, f"r{i}")
        w.heartbeat()
    df = load(spark, tmp_path / "q", interface=SPEC)
    assert df.columns[-2:] == ["method", "args"]
    rows = rows_by_seq(df)
    trade_rows = [r for r in rows if r["method"] == "trade"]
    assert [r["args"]["trade"]["t"] for r in trade_rows] == [as_row(t) for t in trades]
    assert all(r["args"]["cancel"] is None and r["args"]["heartbeat"] is None for r in trade_rows)
    cancels = [r["args"]["cancel"] for r in rows if r["method"] == "cancel"]
    assert cancels == [{"order_id": i, "reason": f"r{i}"} for i in range(0, 40, 10)]
    assert rows[-1]["method"] == "heartbeat" and rows[-1]["args"] == {"trade": None, "cancel": None,
                                                                     "heartbeat": {}}
    # what a user would write: one method's arguments as flat columns
    flat = df.where("method = 'trade'").select("args.trade.t.*").orderBy("timestamp")
    assert flat.first().symbol == "SYM0"
    assert flat.schema["at"].dataType.simpleString() == "timestamp"


def test_unknown_and_undecodable_rows_are_nulls(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "q"
    with chronq.open(path) as q:
        rpc.writer(q, Trades).cancel(1, "ok")
        rpc.writer(q, Others).quote("EURUSD")  # a method the interface does not have
        q.appender().write(b"\xff\xfe not wire at all")
        bad = wire.binary.Writer()
        bad.event_name("cancel")
        bad.value("not a number")  # 'cancel' with arguments that do not decode as (int, str)
        q.appender().write(bad.getvalue())
        q.appender().write(b"")
        huge = wire.binary.Writer()
        huge.event_name("cancel")
        huge.value(["99999999999999999999", "big"])  # decodes as an int no Spark long holds
        q.appender().write(huge.getvalue())
        rpc.writer(q, Trades).cancel(2, "ok")
    rows = rows_by_seq(load(spark, path, interface=SPEC))
    assert [r["method"] for r in rows] == ["cancel", "quote", None, "cancel", None, "cancel", "cancel"]
    assert [r["args"] is None for r in rows] == [False, True, True, True, True, True, False]
    assert bytes(rows[2]["payload"]).startswith(b"\xff\xfe")  # the raw message is still there
    assert rows[6]["args"]["cancel"] == {"order_id": 2, "reason": "ok"}


def test_a_field_added_by_the_writer_reads(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "q"
    newer = [TradeV2(**msgspec.structs.asdict(sample(i)), trader=f"t{i}") for i in range(3)]
    with chronq.open(path) as q:
        w = rpc.writer(q, TradesV2)
        for t in newer:
            w.trade(t)
    rows = rows_by_seq(load(spark, path, interface=SPEC))  # read with the older Trade
    assert [r["args"]["trade"]["t"] for r in rows] == [as_row(sample(i)) for i in range(3)]
    newest = rows_by_seq(load(spark, path, interface="tests.test_spark_typed:TradesV2"))
    assert [r["args"]["trade"]["t"]["trader"] for r in newest] == ["t0", "t1", "t2"]


def test_typed_documents_with_history(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "q"
    with chronq.open(path) as q:
        for i in range(5):
            q.appender().write(wire.binary.encode_document(sample(i)))
        q.appender().write(b"\x01 garbage")
    df = load(spark, path, type="tests.test_spark_typed:Trade", decode="history")
    rows = rows_by_seq(df)
    assert [r["value"] for r in rows[:5]] == [as_row(sample(i)) for i in range(5)]
    assert rows[5]["value"] is None
    assert "method" not in df.columns and "history_timings" in df.columns


def test_json_args_stay_the_default(spark: Any, tmp_path: Path) -> None:
    with chronq.open(tmp_path / "q") as q:
        rpc.writer(q, Trades).cancel(7, "x")
    row = load(spark, tmp_path / "q", decode="method").first()
    assert json.loads(row.args) == [7, "x"]
    typed_ddl = "method string, args struct<cancel: struct<order_id: long>>"
    declared = spark.read.format("chronq").schema(typed_ddl)
    with pytest.raises(Exception, match="a typed 'args' column needs option interface"):
        declared.load(str(tmp_path / "q")).collect()


def test_typed_args_write_back(spark: Any, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    trades = [sample(i) for i in range(6)]
    with chronq.open(src) as q:
        w = rpc.writer(q, Trades)
        for t in trades:
            w.trade(t)
        w.cancel(3, "gone")
        w.heartbeat()
    with chronq.open(dst):
        pass
    load(spark, src, interface=SPEC).select("method", "args").coalesce(1) \
        .write.format("chronq").mode("append").save(str(dst))
    got: list[tuple[str, tuple[Any, ...]]] = []

    class Record:
        def trade(self, t: Trade) -> None:
            got.append(("trade", (t,)))

        def cancel(self, order_id: int, reason: str) -> None:
            got.append(("cancel", (order_id, reason)))

        def heartbeat(self) -> None:
            got.append(("heartbeat", ()))

    with chronq.open(dst, readonly=True) as q:
        r = rpc.reader(q.tailer(), Record(), interfaces=[Trades])
        while r.read_one():
            pass
    assert got == [*(("trade", (t,)) for t in trades), ("cancel", (3, "gone")), ("heartbeat", ())]


def test_typed_args_in_a_stream(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "q"
    with chronq.open(path) as q:
        w = rpc.writer(q, Trades)
        for i in range(25):
            w.cancel(i, f"r{i}")
    query = (spark.readStream.format("chronq").option("interface", SPEC).option("maxRowsPerTrigger", "10")
             .load(str(path)).select("seq", "args.cancel.*")
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    query.awaitTermination()
    got = spark.read.parquet(str(tmp_path / "out")).orderBy("seq").collect()
    assert [(r.order_id, r.reason) for r in got] == [(i, f"r{i}") for i in range(25)]
