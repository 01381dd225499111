"""The ``chronq`` Spark data source: batch reads, a streaming source and an append-only sink.

Everything Spark pickles (the source, readers, partitions) holds only paths and numbers; files are
mapped inside ``read()`` on the executor. Reads are pinned to the documents that were complete when
Spark planned them, so a DataFrame is a consistent snapshot while writers go on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from chronq import _directory
from chronq.errors import ChronqError, CorruptQueueError
from chronq.spark import _archived, _arrow, _decode, _files, _plan, _typed
from chronq.spark._plan import CycleState, Range

SCHEMA_DDL = ("index long not null, cycle int not null, seq long not null, position long not null, "
              "metadata boolean not null, payload binary not null")
DEFAULT_PARTITION_ROWS = 4_000_000
DEFAULT_BATCH_ROWS = 65_536
# every option the source and the sink take (Spark hands a stream's checkpointLocation to its sink)
KNOWN_OPTIONS = (
    "path", "startIndex", "endIndex", "startCycle", "endCycle", "includeMetadata", "partitionRows",
    "batchRows", "decode", "pushFilters", "maxRowsPerTrigger", "startingOffsets", "interface", "type",
    "sinkId", "checkpointLocation", "codecKeys", "archive",
)


@dataclass(frozen=True)
class Options:
    """Parsed, validated data source options (names are case-insensitive in Spark)."""

    path: str
    start_index: int | None
    end_index: int | None
    start_cycle: int | None
    end_cycle: int | None
    include_metadata: bool
    partition_rows: int
    batch_rows: int
    decode: tuple[str, ...]
    push_filters: bool
    max_rows_per_trigger: int | None
    starting: str
    interface: str | None = None
    dto_type: str | None = None
    storage: tuple[tuple[str, str], ...] = ()  # `storage.*` options: fsspec's, for an archive URL
    keys: str | None = None  # module:QualName of a function returning chronq.codecs.Keys (never the keys)
    archive: str | None = None  # an archive URL read before the live queue at `path` (one union view)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        """Every option is checked here, on the driver, before any work: a bad value (or a name chronq
        does not know, such as a misspelling) fails with a message naming the option, rather than being
        ignored or failing later inside a task."""
        names = {k.lower(): k for k in KNOWN_OPTIONS}
        strange = sorted(k for k in options
                         if k.lower() not in names and not k.lower().startswith("storage."))
        if strange:
            raise ChronqError(f"option {strange[0]}: not an option of the chronq data source; "
                              f"known options: {', '.join(KNOWN_OPTIONS)}, "
                              "and storage.* (fsspec's, for an archive)")
        # Spark's names are case-insensitive; `storage.*` ones go to fsspec as they are
        options = {names.get(k.lower(), k): v for k, v in options.items()}
        path = options.get("path")
        if not path:
            raise ChronqError("the chronq data source needs a queue directory: .load(path) or option('path')")
        decode = tuple(d.strip() for d in (options.get("decode") or "").split(",") if d.strip())
        unknown = set(decode) - set(_decode.GROUPS)
        if unknown:
            known = list(_decode.GROUPS)
            raise ChronqError(f"option decode: unknown column group(s) {sorted(unknown)}; known: {known}")
        starting = (options.get("startingOffsets") or "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise ChronqError(f"option startingOffsets must be 'earliest' or 'latest', not {starting!r}")
        return cls(
            path=path,
            start_index=_int_opt(options, "startIndex", 0),
            end_index=_int_opt(options, "endIndex", 0),
            start_cycle=_int_opt(options, "startCycle", 0),
            end_cycle=_int_opt(options, "endCycle", 0),
            include_metadata=_bool_opt(options, "includeMetadata"),
            partition_rows=_int_opt(options, "partitionRows", 1) or DEFAULT_PARTITION_ROWS,
            batch_rows=_int_opt(options, "batchRows", 1) or DEFAULT_BATCH_ROWS,
            decode=decode,
            push_filters=_bool_opt(options, "pushFilters"),
            max_rows_per_trigger=_int_opt(options, "maxRowsPerTrigger", 1),
            starting=starting,
            interface=_class_opt(options, "interface"),
            dto_type=_class_opt(options, "type"),
            storage=tuple(sorted(_archived.storage_options(options).items())),
            keys=_class_opt(options, "codecKeys"),
            archive=options.get("archive") or None,
        )


def _int_opt(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw.strip(), 0)
    except ValueError:
        raise ChronqError(f"option {name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ChronqError(f"option {name}: must be at least {minimum}, got {raw!r}")
    return value


def _class_opt(options: Mapping[str, str], name: str) -> str | None:
    raw = options.get(name)
    if raw is None or raw == "":
        return None
    module, sep, qualname = raw.partition(":")
    if not (module.strip() and sep and qualname.strip()):
        raise ChronqError(f"option {name}: expected 'module:QualName', got {raw!r}")
    return raw


def _bool_opt(options: Mapping[str, str], name: str) -> bool:
    raw = (options.get(name) or "false").lower()
    if raw not in ("true", "false"):
        raise ChronqError(f"option {name}: expected true or false, got {raw!r}")
    return raw == "true"


class ChronqDataSource(DataSource):
    """``spark.read.format("chronq").load(path)``; see docs/spark.md for options and columns."""

    @classmethod
    def name(cls) -> str:
        return "chronq"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._opts = Options.parse(options)

    def schema(self) -> str:
        opts = self._opts
        groups = [_decode.GROUPS[g] for g in opts.decode if not (g == "method" and opts.interface)]
        if opts.interface:  # typed arguments instead of JSON; implies the method columns
            groups.append(f"method string, args {_typed.interface_columns(opts.interface).ddl}")
        if opts.dto_type:
            groups.append(f"value {_typed.document_column(opts.dto_type).ddl}")
        return ", ".join([SCHEMA_DDL, *groups])

    def reader(self, schema: StructType) -> DataSourceReader:
        cls = FilteringBatchReader if self._opts.push_filters else BatchReader
        return cls(self._opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(self._opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from chronq.spark.sink import QueueWriter

        if overwrite:
            raise ChronqError("a chronq queue is append-only: use mode('append')")
        return QueueWriter(self._opts.path, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from chronq.spark.sink import QueueStreamWriter

        if overwrite:
            raise ChronqError("a chronq queue is append-only: use outputMode('append')")
        return QueueStreamWriter(self._opts.path, schema, self.options)


# --------------------------------------------------------------------------------------------- reading


class _Reading:
    """What batch and stream readers share: the declared columns and the executor-side walk."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.names = tuple(schema.fieldNames())
        fields = []
        for field in schema.fields:
            name = field.name
            if name == "value" or (name == "args" and isinstance(field.dataType, StructType)):
                needs, option = ("type", opts.dto_type) if name == "value" else ("interface", opts.interface)
                if option is None:
                    raise ChronqError(f"a typed {name!r} column needs option {needs} (module:QualName)")
                fields.append(to_arrow_schema(StructType([field]), timezone="UTC").field(0))
            elif name in _arrow.BASE_NAMES or name in _decode.COLUMNS:
                fields.append(_arrow_field(name, field.nullable))
            else:
                raise ChronqError(f"column {name!r} is not produced by the chronq source")
        self.arrow_schema = pa.schema(fields)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rng = getattr(partition, "value", None)
        if not isinstance(rng, Range):  # Spark's placeholder when there is nothing to read
            return
        opts = self.opts
        yield from read_range(rng, self.names, self.arrow_schema, opts.include_metadata, opts.batch_rows,
                              interface=opts.interface, dto_type=opts.dto_type, keys=opts.keys)


def _arrow_field(name: str, nullable: bool = True) -> pa.Field:
    """The Arrow field of a column, as nullable as Spark was told (the base columns are declared not
    null, which spares the JVM a null check per value when it converts the batches)."""
    base = dict(_arrow.BASE_FIELDS)
    return pa.field(name, base[name] if name in base else _decode.COLUMNS[name], nullable=nullable)


def read_range(
    rng: Range, names: Sequence[str], schema: pa.Schema, include_metadata: bool, batch_rows: int,
    *, interface: str | None = None, dto_type: str | None = None, keys: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one planned range; maps the file (or an archived range's frames, fetched and
    decompressed by this executor as the walk reaches them) for the duration of the read only."""
    from chronq.codecs import payload_decoder

    frames = _archived.Frames(rng) if isinstance(rng, _archived.ArchivedRange) else None
    buf: Any = frames.buf if frames is not None else _directory.open_map(rng.path)
    if buf is None:
        return
    types = {f.name: f.type for f in schema}
    try:
        ring = _keys(keys)  # a queue with a codec: payloads decoded as its tailers decode them
        decode = (frames.payload_decoder(ring) if frames is not None
                  else payload_decoder(Path(rng.path).parent, ring))
        codec = _codec_payloads(decode, names)
        pos, seq = rng.start_pos, rng.start_seq
        base = frames.base if frames is not None else 0  # positions in `buf` are the file's minus this
        while True:
            end_pos = rng.end_pos if frames is None else frames.limit(pos)
            try:
                w = _files.walk(buf, rng.path, rng.aligned, pos - base, seq, end_pos=end_pos - base,
                                lo_seq=rng.lo, hi_seq=rng.hi, max_rows=batch_rows,
                                include_metadata=include_metadata)
            except CorruptQueueError as e:
                raise CorruptQueueError(e.file, e.position + base, e.detail) from None
            next_pos = w.next_pos + base
            if len(w.positions):
                cols = [
                    _arrow.base_column(n, buf, w, rng, base) if n in _arrow.BASE_NAMES else None
                    for n in names
                ]
                if any(c is None for c in cols):
                    decoded = _decode.columns(buf, w, [n for n in names if n not in _arrow.BASE_NAMES],
                                              types, interface, dto_type)
                    cols = [c if c is not None else decoded[n] for c, n in zip(cols, names, strict=True)]
                if codec is not None:
                    cols = codec(cols, w, rng)
                yield pa.RecordBatch.from_arrays(cols, schema=schema)
            # on after the row limit (rows before `lo` may have made the batch shorter), and where an
            # archived range's decompressed frames ended; not at `hi`, the range's end, EOF or an
            # unwritten header
            more = w.stop == _files.STOP_LIMIT and w.next_seq < rng.hi and (
                next_pos + 4 <= end_pos or end_pos < rng.end_pos)
            if not more or next_pos == pos:
                return
            if frames is not None:
                frames.release(next_pos)  # the batches hold copies: the walked pages can go
            pos, seq = next_pos, w.next_seq
    finally:
        if frames is not None:
            frames.close()
        else:
            _directory.close_map(buf)


def _keys(keys: str | None) -> Any:
    """The codec keys option `codecKeys` names (module:QualName of a function returning them)."""
    from chronq.codecs import Keys

    if keys is None:
        return None
    ring = _typed.load(keys, "codecKeys")()
    if not isinstance(ring, Keys):
        raise ChronqError(f"option codecKeys: {keys} returned {type(ring).__name__}, "
                          "not chronq.codecs.Keys")
    return ring


def _codec_payloads(
    decode: Callable[[Any, int], bytes] | None, names: Sequence[str]
) -> Callable[[list[pa.Array], Any, Range], list[pa.Array]] | None:
    """For a queue with a codec (chronq.codecs; `decode` turns a stored payload into the plain one): a
    function replacing the stored payloads of a batch by the plain ones (metadata documents are never
    encoded); None for a plain queue."""
    if decode is None:
        return None
    other = [n for n in names if n not in _arrow.BASE_NAMES]
    if other:
        raise ChronqError(f"columns {other} decode wire bodies, which a queue with a codec stores encoded; "
                          "read the payload column")
    if "payload" not in names:
        return None
    at = list(names).index("payload")

    def replace(cols: list[pa.Array], w: Any, rng: Range) -> list[pa.Array]:
        shift = np.int64(rng.shift)
        stored = cols[at].to_pylist()
        cols[at] = pa.array([
            body if meta else decode(body, int((np.int64(rng.cycle) << shift) | seq))
            for body, meta, seq in zip(stored, w.metas, w.seqs, strict=True)
        ], pa.binary())
        return cols
    return replace


class BatchReader(_Reading, DataSourceReader):
    """Plans a snapshot of the queue at the first ``partitions()`` call (Spark plans once per DataFrame)."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        super().__init__(opts, schema)
        self.lo_index = opts.start_index
        self.hi_index = opts.end_index  # exclusive
        self.first_cycle = opts.start_cycle
        self.last_cycle = opts.end_cycle

    def partitions(self) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        storage = dict(self.opts.storage)
        if _archived.is_archive(self.opts.path, storage):
            return [InputPartition(r) for r in _archived.ranges(
                self.opts.path, storage, self.first_cycle, self.last_cycle, self.lo_index, self.hi_index,
                rows=self.opts.partition_rows)]
        live = _plan.snapshot(self.opts.path, self.first_cycle, self.last_cycle)
        if self.opts.archive is not None:
            # live cycles win: a cycle archived but not yet deleted from the queue is read once, there
            skip = _archived.seam(self.opts.archive, storage, self.opts.path, live)
            out.extend(InputPartition(r) for r in _archived.ranges(
                self.opts.archive, storage, self.first_cycle, self.last_cycle, self.lo_index, self.hi_index,
                skip=skip, rows=self.opts.partition_rows))
        for st in live:
            lo, hi = 0, st.count
            if self.lo_index is not None:
                lo = _seq_bound(self.lo_index, st)
            if self.hi_index is not None:
                hi = min(hi, _seq_bound(self.hi_index, st))
            out.extend(InputPartition(r) for r in _plan.ranges(st, lo, hi, self.opts.partition_rows))
        return out


def _seq_bound(index: int, st: CycleState) -> int:
    """First sequence of cycle ``st`` whose index is >= ``index``."""
    shift = st.layout.shift
    cycle = index >> shift
    if cycle < st.cycle:
        return 0
    if cycle > st.cycle:
        return 1 << 62
    return index & ((1 << shift) - 1)


class FilteringBatchReader(BatchReader):
    """Opt-in (option ``pushFilters`` plus ``spark.sql.python.filterPushdown.enabled``) range pruning.

    Pushed filters only narrow the planned ranges; all are handed back to Spark, which still applies
    them, so a filter is never trusted for correctness. PySpark 4.3 reuses the pruned partitions for
    later actions on the same DataFrame object; docs/spark.md says to load a fresh DataFrame per query.
    """

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        from pyspark.sql import datasource as ds

        for f in filters:
            attribute: tuple[str, ...] = getattr(f, "attribute", ())
            col = attribute[0] if len(attribute) == 1 else None
            value = getattr(f, "value", None)
            if col in ("index", "cycle") and isinstance(value, int):
                lo, hi = {
                    ds.EqualTo: (value, value + 1),
                    ds.GreaterThan: (value + 1, None),
                    ds.GreaterThanOrEqual: (value, None),
                    ds.LessThan: (None, value),
                    ds.LessThanOrEqual: (None, value + 1),
                }.get(type(f), (None, None))
                if col == "index":
                    self.lo_index = _max(self.lo_index, lo)
                    self.hi_index = _min(self.hi_index, hi)
                else:
                    self.first_cycle = _max(self.first_cycle, lo)
                    self.last_cycle = _min(self.last_cycle, None if hi is None else hi - 1)
            yield f


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


# --------------------------------------------------------------------------------------------- streaming


def offset(cycle: int, seq: int) -> dict[str, int]:
    """A stream offset: the queue position (cycle, next sequence to read), JSON with a fixed key order."""
    return {"cycle": int(cycle), "seq": int(seq)}


@dataclass(frozen=True)
class _StreamCycle:
    """One cycle a stream can read: a live one (`state`) or an archived one (`archived`, whole)."""

    cycle: int
    count: int
    shift: int
    state: CycleState | None = None
    archived: _archived.ArchivedRange | None = None

    def ranges(self, lo: int, hi: int, rows: int) -> list[Range]:
        if self.state is not None:
            return _plan.ranges(self.state, lo, hi, rows)
        assert self.archived is not None
        return [_archived.narrow(self.archived, lo, hi)] if lo < hi else []


class StreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between queue positions; runs in one long-lived driver-side process per query.

    With option `archive`, the archived cycles come first: offsets are the same (cycle, seq) positions,
    so the archive is only the earlier offsets. Both sides are listed afresh for every batch, the queue
    before the manifest: a cycle archived and deleted meanwhile is then found in the manifest, and a
    stream goes on while archiving runs.
    """

    def __init__(self, opts: Options, schema: StructType) -> None:
        super().__init__(opts, schema)
        self._pinned: dict[int, int] = {}  # cycle -> count of a cycle once a later cycle was seen
        self._available_now: dict[str, int] | None = None

    def _states(self, from_cycle: int) -> list[CycleState]:
        first = max(from_cycle, self.opts.start_cycle if self.opts.start_cycle is not None else from_cycle)
        return _plan.snapshot(self.opts.path, first, self.opts.end_cycle)

    def _cycles(self, from_cycle: int) -> list[_StreamCycle]:
        live = self._states(from_cycle)
        out = [_StreamCycle(st.cycle, st.count, st.layout.shift, state=st) for st in live]
        if self.opts.archive is not None:
            storage = dict(self.opts.storage)
            skip = _archived.seam(self.opts.archive, storage, self.opts.path, live)
            first = max(from_cycle, -1 if self.opts.start_cycle is None else self.opts.start_cycle)
            out += [_StreamCycle(r.cycle, r.hi, r.shift, archived=r) for r in _archived.whole_cycles(
                self.opts.archive, storage, first, self.opts.end_cycle, skip)]
            out.sort(key=lambda c: c.cycle)
        return out

    def _end(self) -> dict[str, int]:
        cycles = self._cycles(-1)
        if not cycles:
            return offset(-1, 0)
        return offset(cycles[-1].cycle, cycles[-1].count)

    def initialOffset(self) -> dict[str, int]:
        if self.opts.starting == "latest":
            return self._end()
        if self.opts.start_index is not None:
            cycles = self._cycles(-1)
            if cycles:
                shift = cycles[0].shift
                return offset(self.opts.start_index >> shift, self.opts.start_index & ((1 << shift) - 1))
        return offset(-1, 0)

    def getDefaultReadLimit(self) -> ReadLimit:
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        n = self.opts.max_rows_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._end()

    def reportLatestOffset(self) -> dict[str, int]:
        return self._end()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        cap = self._available_now
        end = offset(start["cycle"], start["seq"])
        for st in self._cycles(start["cycle"]):
            if cap is not None and st.cycle > cap["cycle"]:
                break
            count = st.count if cap is None or st.cycle < cap["cycle"] else min(st.count, cap["seq"])
            lo = start["seq"] if st.cycle == start["cycle"] else 0
            take = max(0, count - lo)
            if budget is not None:
                if take >= budget:
                    return offset(st.cycle, lo + budget)
                budget -= take
            self._pinned[st.cycle] = lo + take  # what partitions() reads of this cycle if the batch passes it
            end = offset(st.cycle, lo + take)
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        for st in self._cycles(start["cycle"]):
            if st.cycle > end["cycle"]:
                break
            lo = start["seq"] if st.cycle == start["cycle"] else 0
            hi = end["seq"] if st.cycle == end["cycle"] else self._pinned.get(st.cycle, st.count)
            if lo < hi:
                out.extend(InputPartition(r) for r in st.ranges(lo, hi, self.opts.partition_rows))
        return out

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: a tailer never consumes, and the checkpoint holds the position."""

    def stop(self) -> None:
        """No open resources: files are mapped only inside ``read()``."""


def offset_json(cycle: int, seq: int) -> str:
    return json.dumps(offset(cycle, seq))


__all__ = [
    "BatchReader",
    "ChronqDataSource",
    "FilteringBatchReader",
    "Options",
    "StreamReader",
    "offset",
    "offset_json",
    "read_range",
]
