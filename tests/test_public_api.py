"""The public surface of wire, chronq and rpc, pinned: an export added or dropped by accident fails here.

A module whose path has no `_`-prefixed part is public. Each one declares `__all__`; the lists below
are what users may rely on. Changing the surface on purpose means changing this file in the same commit.
Every public class or function a public module defines is either in its `__all__` or named with a
leading underscore, so that a helper written for one module does not become API by being visible.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import chronq
from tests.conftest import skip_unless_strict

# the folder the packages are imported from: this tree, or site-packages when the suite runs against an
# installed wheel (`make test-pythons`)
ROOT = Path(chronq.__file__).resolve().parents[1]
PACKAGES = ("wire", "chronq", "rpc")

EXPORTS: dict[str, list[str]] = {
    "chronq": [
        "Appender", "BusyPauser", "ChronqError", "CorruptQueueError", "Direction", "DocumentContext",
        "Doorbell",
        "Excerpt", "ExcerptLike", "IndexNotFoundError", "Pauser", "Queue", "QueueExcerpt", "QueueLockedError",
        "Reader", "RollCycleMismatchError",
        "SleepingPauser", "SyncMode", "Tailer", "TailerState", "WakeupPauser", "YieldingPauser", "merge",
        "open",
    ],
    "chronq.appender": ["Appender", "AppenderListener", "DocumentContext", "Pretoucher", "SyncMode"],
    "chronq.archive": [
        "Archive", "ArchiveTailer", "ArchivedExcerpt", "CycleReader", "FRAME", "LOCK_FILE", "MANIFEST",
        "archive", "filesystem", "open", "restore", "verify",
    ],
    "chronq.cli": ["UsageError", "load_object", "main", "queue_stats"],
    "chronq.codecs": [
        "CODEC_KEY", "Codec", "CodecAppender", "CodecError", "CodecTailer", "DecodedExcerpt", "Keys",
        "MessageTooLargeError", "MissingKeyError", "TamperedMessageError", "configure", "decode",
        "dictionary_ids", "dictionary_path", "encode", "payload_decoder", "store_dictionary",
        "stored_payload_decoder", "train_dictionary",
    ],
    "chronq.doorbell": ["DOORBELL_KEY", "Doorbell", "Notifier", "ringing_enabled", "uring_enabled"],
    "chronq.dump": ["dump_lines", "dump_records", "dump_text", "queue_files"],
    "chronq.durable": ["replacing", "write_file"],
    "chronq.errors": [
        "ChronqError", "CorruptQueueError", "IndexNotFoundError", "QueueLockedError",
        "RollCycleMismatchError", "WireError",
    ],
    "chronq.latency": [
        "FRACTION_BITS", "Histogram", "HistoryReport", "METRICS", "PERCENTILES", "UNITS", "analyze",
        "draw_percentiles", "format_table", "percentile_label", "plot", "queues_read",
        "write_csv",
    ],
    "chronq.merge": ["merge"],
    "chronq.pausers": [
        "DEFAULT_MAX_WAIT", "MAX_ALSO", "SPACED_IDLE_WAIT", "WATCH_LINGER", "BackoffPauser", "BusyPauser",
        "Pauser", "SleepingPauser",
        "WakeupPauser",
        "YieldingPauser",
    ],
    "chronq.plugins": ["LoadError", "entry_point", "entry_points", "load_object"],
    "chronq.progress": ["Progress", "wanted"],
    "chronq.queue": ["CycleFile", "Queue", "QueueExcerpt", "open"],
    "chronq.replication": [
        "AcknowledgedTailer", "AcknowledgementTimeout", "AuthenticationError", "ConfigError", "CycleClock",
        "HostStatus", "LinkStatus", "Position", "ProtocolError", "ReplicatedQueue", "ReplicationConfig",
        "ReplicationError", "SinkWriter", "SourceReader", "SplitBrainError", "last_acknowledged_index",
        "last_replicated_index", "load_config", "parse_config", "promote", "wait_acknowledged",
    ],
    "chronq.replication.acknowledged": [
        "AcknowledgedTailer", "last_acknowledged_index", "last_replicated_index", "wait_acknowledged",
    ],
    "chronq.replication.bounds": [
        "CLOCK_SLACK_MS", "MAX_CYCLE_LENGTH_MS", "MAX_CYCLE_SHIFT", "MAX_EPOCH_MS", "MAX_INDEX_COUNT",
        "MAX_INDEX_SPACING", "IndexBound", "queue_roll_cycle",
    ],
    "chronq.replication.config": ["HostCfg", "QueueCfg", "ReplicationConfig", "UdpCfg", "load_config",
                                  "parse_config"],
    "chronq.replication.endpoints": ["ReplicatedQueue"],
    "chronq.replication.errors": [
        "AcknowledgementTimeout", "AuthenticationError", "ConfigError", "ProtocolError", "ReplicationError",
        "SplitBrainError",
    ],
    "chronq.replication.failover": [
        "NOT_A_SINK", "PROMOTED_AT", "PROMOTED_FROM", "check_same_history", "excerpt_hash", "last_excerpt",
        "promote",
    ],
    "chronq.replication.protocol": [
        "Ack", "Auth", "Challenge", "DEFAULT_MAX_FRAME", "Error", "Excerpts", "Frame", "FrameAuth",
        "FrameDecoder", "Heartbeat", "Hello", "MAX_HOST_ID", "MAX_MAX_FRAME", "NONCE_SIZE", "QueueCodec",
        "QueueInfo", "RUN_HEAD", "RUN_META", "Run", "Subscribe", "TailerPositions", "VERSION", "encode",
        "proof", "run_head", "Datagram", "Nak", "UdpAck", "UdpGroup", "UdpPosition", "UdpStart", "UdpStop",
        "UdpSubscribe",
    ],
    "chronq.replication.sink": [
        "CycleClock", "Excerpt", "Position", "SinkWriter", "is_store_document", "read_position",
        "record_codec",
    ],
    "chronq.replication.source": ["CodecState", "SourceReader"],
    "chronq.replication.status": [
        "DatagramCounts", "HostStatus", "LinkState", "LinkStatus", "Role", "format_status",
        "read_status_file",
        "status_file_path", "write_status_file",
    ],
    "chronq.retention": [
        "HOLD_PREFIX", "Policy", "RetentionResult", "delete_cycle_file", "hold", "holds", "parse_duration",
        "protected_from", "release", "retain",
    ],
    "chronq.rollcycles": [
        "Clock", "DEFAULT", "FAST_DAILY", "FixedClock", "ROLL_CYCLES", "RollCycle", "SystemClock", "WEEKLY",
        "by_format", "by_name", "file_splits",
    ],
    "chronq.spark": ["ChronqDataSource", "register"],
    "chronq.spark.latency": ["HopStats", "LatencyReport", "end_to_end_frame", "hop_frame", "report"],
    "chronq.spark.session": ["local_session"],
    "chronq.spark.sink": ["QueueStreamWriter", "QueueWriter", "Staged", "stream_id"],
    "chronq.spark.source": [
        "BatchReader", "ChronqDataSource", "FilteringBatchReader", "Options", "StreamReader", "offset",
        "offset_json", "read_range",
    ],
    "chronq.store": [
        "CycleRoll", "DATA_FORMAT", "Document", "END_OF_DATA", "INIT_PID_NAMESPACE", "LENGTH_MASK",
        "MAX_FIRST_HEADER", "META_DATA", "NOT_COMPLETE", "ProcessIdentity", "StoreLayout", "align4",
        "create_cycle_file", "cycle_file_prefix", "cycle_file_size", "documents", "framed",
        "headerless_layout", "index_doc", "is_headerless", "load32", "load64", "looks_like_store_header",
        "open_regular",
        "process_alive", "process_identity", "process_start_time", "publish_file", "read_layout",
        "remove_abandoned_files", "stop_header",
    ],
    "chronq.table": [
        "APPEND_LOCK", "HIGHEST_CYCLE", "LAST_ACKNOWLEDGED_INDEX_REPLICATED", "LAST_INDEX_MSYNCED",
        "LAST_INDEX_REPLICATED", "LOWEST_CYCLE", "LockOwner", "MAX_KEY_LENGTH", "MAX_TAILER_NAME",
        "MOD_COUNT",
        "NORMALISED_EOFS_TO", "RollMetadata", "TABLE_STORE_FILE", "TableStore", "UNLOCKED",
        "V4_TABLE_STORE_FILE", "WRITER_SLOTS", "WRITE_LOCK", "check_key", "check_tailer_name",
        "find_table_store", "tailer_index_key", "tailer_lock_key", "tailer_version_key",
    ],
    "chronq.tailer": [
        "Direction", "Excerpt", "ExcerptLike", "Reader", "Tailer", "TailerState", "read_failed",
    ],
    "rpc": [
        "DeadLetter", "DeadLetterHook", "InputStatus", "InterfaceSpec", "MethodReader", "MethodSpec",
        "Output", "PoisonHook", "Service", "ServiceStatus", "SnapshotRecord", "Snapshottable", "Start",
        "current_history", "describe", "interface", "log_poison", "method_id", "reader", "writer",
    ],
    "rpc.aio": ["AsyncMethodReader", "excerpts"],
    "rpc.cli": ["interface_calls", "interface_decoder", "register"],
    "rpc.service": [
        "DeadLetter", "DeadLetterHook", "InputPosition", "InputStatus", "Output", "Service", "ServiceLog",
        "ServiceStatus", "SnapshotRecord", "Snapshots", "Snapshottable", "Start", "last_source_index",
    ],
    "rpc.services": [
        "QueueSpec", "Runner", "RunnerSpec", "ServiceSpec", "ServicesConfig", "ServicesConfigError",
        "Snapshot", "load_services", "parse_services",
    ],
    "rpc.services.cli": ["register"],
    "rpc.services.config": [
        "QueueSpec", "RunnerSpec", "ServiceSpec", "ServicesConfig", "ServicesConfigError", "Snapshot",
        "load_services", "parse_services",
    ],
    "rpc.services.runner": ["Runner"],
    "rpc.services.status": [
        "RUNNER_FILE", "ServiceState", "collect_status", "format_status", "metrics_collector",
        "read_runner_status", "write_runner_status", "write_service_status",
    ],
    "rpc.services.worker": ["is_active_host", "main", "process_main", "run_service"],
    "rpc.testing": ["Recorder", "ReplayResult", "YamlTester", "read_calls", "render_calls"],
    "rpc.testing.plugin": [
        "ScenarioFile", "ScenarioItem", "load_factory", "load_interfaces", "pytest_addoption",
        "pytest_collect_file",
    ],
    "rpc.testing.strategies": [
        "Call", "agitated", "apply", "call", "calls", "dropped", "dtos", "duplicated", "reordered", "values",
    ],
    "rpc.testing.yaml_tester": [
        "Recorder", "ReplayResult", "YamlTester", "decode_call", "encode_call", "read_calls", "render_calls",
    ],
    "wire": [
        "ClassFields", "EventName", "Field", "FieldNumber", "Float32", "HistoryBytes", "Int64Array",
        "Int64Hex", "MessageHistory", "TypeLiteral", "Typed", "WireError", "WireType", "binary", "fields_of",
        "read_history", "register", "text", "unknown_types",
    ],
    "wire.binary": [
        "Decoder", "Encoder", "Reader", "TypedCodec", "Writer", "decode", "decode_document", "decoder_for",
        "encode", "encode_document", "encoder_for", "install_typed", "put_bytes", "put_field", "put_float",
        "put_float32", "put_int", "put_text", "typed", "utf8", "write_stop_bit", "write_value",
    ],
    "wire.errors": ["WireError"],
    "wire.fieldless": ["decode", "decoder_for", "encode", "encoder_for"],
    "wire.history": ["MessageHistory", "last_source", "read_history"],
    "wire.marshal": [
        "K_BOOL", "K_ENUM", "K_FLOAT", "K_FLOAT32", "K_INT", "K_OTHER", "K_STR", "arguments_plan",
        "decode_bytes", "decoder_for", "document_encoder", "encoder_for", "field_encoder_for",
        "fields_decoder_for", "learn_whole_encoder", "native_plan", "positional", "speedups",
        "whole_decoders", "whole_encoders", "write_fields", "write_object",
    ],
    "wire.methods": [
        "EventCall", "EventValue", "HistoryHop", "PendingHop", "ReadOne", "ReadOneType", "Table",
        "accelerated", "encode_call", "event_at", "event_bytes", "event_call", "event_value", "events",
        "history_call", "history_hop",
    ],
    "wire.record": ["KINDS", "Layout", "RecordReader", "RecordWriter"],
    "wire.registry": ["alias_of", "lookup", "note_unknown", "register", "unknown_types"],
    "wire.text": [
        "MAX_YAML_DOCUMENT", "from_yaml", "from_yaml_all", "java_double", "java_double_to_string",
        "json_value", "looks_binary", "quote", "render", "to_json", "to_yaml", "to_yaml_all",
    ],
    "wire.types": [
        "EventName", "FieldNumber", "Float32", "HistoryBytes", "Int64Array", "Int64Hex", "TypeLiteral",
        "Typed",
    ],
    "wire.wiretype": ["Codec", "WireType"],
}

# needed only by chronq.spark; a run without the spark extra skips those modules (CI has it)
OPTIONAL_DEPENDENCIES = {"pyspark", "pyarrow", "pandas"}


def public_modules() -> list[str]:
    """Every module of the packages whose dotted name has no `_`-prefixed part (from the files, so that
    finding them imports nothing)."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts[-1] == "__main__" or any(p.startswith("_") for p in parts):
                continue
            found.append(".".join(parts))
    return found


def _import(name: str) -> object:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] in OPTIONAL_DEPENDENCIES:
            skip_unless_strict(f"{name} needs {e.name}")
        raise


def test_every_public_module_is_pinned() -> None:
    # a new public module needs its `__all__` pinned here; a removed one must leave this list too
    assert sorted(public_modules()) == sorted(EXPORTS)


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_exports_are_pinned(name: str) -> None:
    module = _import(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert sorted(exported) == sorted(EXPORTS[name])
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what the module lacks: {missing}"


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_public_definitions_are_exported_or_underscored(name: str) -> None:
    module = _import(name)
    stray = sorted(
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == name
        and attr not in EXPORTS[name]
    )
    assert not stray, f"{name} defines public names outside __all__ (export them or prefix _): {stray}"
