from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RowFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ARROW: _ClassVar[RowFormat]
    ROWS: _ClassVar[RowFormat]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    COMMITTED: _ClassVar[Outcome]
    DUPLICATE: _ClassVar[Outcome]
    REJECTED: _ClassVar[Outcome]
ARROW: RowFormat
ROWS: RowFormat
OUTCOME_UNSPECIFIED: Outcome
COMMITTED: Outcome
DUPLICATE: Outcome
REJECTED: Outcome

class Value(_message.Message):
    __slots__ = ("int_value", "double_value", "string_value", "bool_value", "bytes_value", "list_value")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    double_value: float
    string_value: str
    bool_value: bool
    bytes_value: bytes
    list_value: ValueList
    def __init__(self, int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bool_value: _Optional[bool] = ..., bytes_value: _Optional[bytes] = ..., list_value: _Optional[_Union[ValueList, _Mapping]] = ...) -> None: ...

class ValueList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Rows(_message.Message):
    __slots__ = ("columns", "rows")
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedScalarFieldContainer[str]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    def __init__(self, columns: _Optional[_Iterable[str]] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ...) -> None: ...

class RowData(_message.Message):
    __slots__ = ("arrow_ipc", "rows")
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    rows: Rows
    def __init__(self, arrow_ipc: _Optional[bytes] = ..., rows: _Optional[_Union[Rows, _Mapping]] = ...) -> None: ...

class DeployRequest(_message.Message):
    __slots__ = ("sql",)
    SQL_FIELD_NUMBER: _ClassVar[int]
    sql: str
    def __init__(self, sql: _Optional[str] = ...) -> None: ...

class CatalogObject(_message.Message):
    __slots__ = ("kind", "name")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeployResponse(_message.Message):
    __slots__ = ("created", "dropped", "plans")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    created: _containers.RepeatedCompositeFieldContainer[CatalogObject]
    dropped: _containers.RepeatedCompositeFieldContainer[CatalogObject]
    plans: _containers.RepeatedCompositeFieldContainer[StatementPlan]
    def __init__(self, created: _Optional[_Iterable[_Union[CatalogObject, _Mapping]]] = ..., dropped: _Optional[_Iterable[_Union[CatalogObject, _Mapping]]] = ..., plans: _Optional[_Iterable[_Union[StatementPlan, _Mapping]]] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class StatementPlan(_message.Message):
    __slots__ = ("unit", "index", "sql", "compiled", "plan", "reason")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    COMPILED_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    unit: str
    index: int
    sql: str
    compiled: bool
    plan: str
    reason: str
    def __init__(self, unit: _Optional[str] = ..., index: _Optional[int] = ..., sql: _Optional[str] = ..., compiled: _Optional[bool] = ..., plan: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("statements",)
    STATEMENTS_FIELD_NUMBER: _ClassVar[int]
    statements: _containers.RepeatedCompositeFieldContainer[StatementPlan]
    def __init__(self, statements: _Optional[_Iterable[_Union[StatementPlan, _Mapping]]] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("stream", "producer_id", "batch_id", "data", "batch_rows")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    producer_id: str
    batch_id: int
    data: RowData
    batch_rows: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, stream: _Optional[str] = ..., producer_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., data: _Optional[_Union[RowData, _Mapping]] = ..., batch_rows: _Optional[_Iterable[int]] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("stream", "producer_id", "batch_id", "outcome", "timestamp", "code", "reason", "original", "rows", "count")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    producer_id: str
    batch_id: int
    outcome: Outcome
    timestamp: int
    code: int
    reason: str
    original: Outcome
    rows: int
    count: int
    def __init__(self, stream: _Optional[str] = ..., producer_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., timestamp: _Optional[int] = ..., code: _Optional[int] = ..., reason: _Optional[str] = ..., original: _Optional[_Union[Outcome, str]] = ..., rows: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class CallRequest(_message.Message):
    __slots__ = ("procedure", "params", "format")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    PROCEDURE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    procedure: str
    params: _containers.MessageMap[str, Value]
    format: RowFormat
    def __init__(self, procedure: _Optional[str] = ..., params: _Optional[_Mapping[str, Value]] = ..., format: _Optional[_Union[RowFormat, str]] = ...) -> None: ...

class CallResponse(_message.Message):
    __slots__ = ("timestamp", "results")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    results: _containers.RepeatedCompositeFieldContainer[RowData]
    def __init__(self, timestamp: _Optional[int] = ..., results: _Optional[_Iterable[_Union[RowData, _Mapping]]] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("sql", "params", "format")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    SQL_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    sql: str
    params: _containers.MessageMap[str, Value]
    format: RowFormat
    def __init__(self, sql: _Optional[str] = ..., params: _Optional[_Mapping[str, Value]] = ..., format: _Optional[_Union[RowFormat, str]] = ...) -> None: ...

class QueryResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: RowData
    def __init__(self, result: _Optional[_Union[RowData, _Mapping]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("stream", "from_ts", "format")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FROM_TS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    from_ts: int
    format: RowFormat
    def __init__(self, stream: _Optional[str] = ..., from_ts: _Optional[int] = ..., format: _Optional[_Union[RowFormat, str]] = ...) -> None: ...

class StreamBatch(_message.Message):
    __slots__ = ("stream", "ts", "data")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    stream: str
    ts: int
    data: RowData
    def __init__(self, stream: _Optional[str] = ..., ts: _Optional[int] = ..., data: _Optional[_Union[RowData, _Mapping]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PartitionCheckpoint(_message.Message):
    __slots__ = ("partition", "path", "lsn")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    partition: int
    path: str
    lsn: int
    def __init__(self, partition: _Optional[int] = ..., path: _Optional[str] = ..., lsn: _Optional[int] = ...) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("timestamp", "partitions")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionCheckpoint]
    def __init__(self, timestamp: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionCheckpoint, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PartitionStatus(_message.Message):
    __slots__ = ("id", "pid", "alive", "queued", "error", "metrics")
    ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    id: int
    pid: int
    alive: bool
    queued: int
    error: str
    metrics: PartitionMetrics
    def __init__(self, id: _Optional[int] = ..., pid: _Optional[int] = ..., alive: _Optional[bool] = ..., queued: _Optional[int] = ..., error: _Optional[str] = ..., metrics: _Optional[_Union[PartitionMetrics, _Mapping]] = ...) -> None: ...

class Histogram(_message.Message):
    __slots__ = ("bounds", "counts", "sum", "count")
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    bounds: _containers.RepeatedScalarFieldContainer[float]
    counts: _containers.RepeatedScalarFieldContainer[int]
    sum: float
    count: int
    def __init__(self, bounds: _Optional[_Iterable[float]] = ..., counts: _Optional[_Iterable[int]] = ..., sum: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class ProcedureMetrics(_message.Message):
    __slots__ = ("procedure", "tes_committed", "tes_aborted", "te_seconds")
    PROCEDURE_FIELD_NUMBER: _ClassVar[int]
    TES_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    TES_ABORTED_FIELD_NUMBER: _ClassVar[int]
    TE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    procedure: str
    tes_committed: int
    tes_aborted: int
    te_seconds: Histogram
    def __init__(self, procedure: _Optional[str] = ..., tes_committed: _Optional[int] = ..., tes_aborted: _Optional[int] = ..., te_seconds: _Optional[_Union[Histogram, _Mapping]] = ...) -> None: ...

class PartitionMetrics(_message.Message):
    __slots__ = ("cpu_seconds", "procedures", "log_sync_seconds", "checkpoint_seconds", "interval_tes", "log_bytes", "checkpoint_bytes", "dedup", "recovery_seconds")
    class DedupEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROCEDURES_FIELD_NUMBER: _ClassVar[int]
    LOG_SYNC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_TES_FIELD_NUMBER: _ClassVar[int]
    LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEDUP_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    cpu_seconds: float
    procedures: _containers.RepeatedCompositeFieldContainer[ProcedureMetrics]
    log_sync_seconds: Histogram
    checkpoint_seconds: Histogram
    interval_tes: Histogram
    log_bytes: int
    checkpoint_bytes: int
    dedup: _containers.ScalarMap[str, int]
    recovery_seconds: float
    def __init__(self, cpu_seconds: _Optional[float] = ..., procedures: _Optional[_Iterable[_Union[ProcedureMetrics, _Mapping]]] = ..., log_sync_seconds: _Optional[_Union[Histogram, _Mapping]] = ..., checkpoint_seconds: _Optional[_Union[Histogram, _Mapping]] = ..., interval_tes: _Optional[_Union[Histogram, _Mapping]] = ..., log_bytes: _Optional[int] = ..., checkpoint_bytes: _Optional[int] = ..., dedup: _Optional[_Mapping[str, int]] = ..., recovery_seconds: _Optional[float] = ...) -> None: ...

class StreamMetrics(_message.Message):
    __slots__ = ("stream", "committed", "rejected", "duplicate", "rows")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    committed: int
    rejected: int
    duplicate: int
    rows: int
    def __init__(self, stream: _Optional[str] = ..., committed: _Optional[int] = ..., rejected: _Optional[int] = ..., duplicate: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("version", "executor", "partitions", "tables", "streams", "windows", "procedures", "triggers", "counters", "last_timestamp", "views", "stream_metrics", "recovery_seconds", "groups", "indexes", "bins", "bins_per_partition", "rebalancing", "bin_owner", "rebalance_interrupted", "keys_per_partition")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    PROCEDURES_FIELD_NUMBER: _ClassVar[int]
    TRIGGERS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    LAST_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    STREAM_METRICS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    BINS_FIELD_NUMBER: _ClassVar[int]
    BINS_PER_PARTITION_FIELD_NUMBER: _ClassVar[int]
    REBALANCING_FIELD_NUMBER: _ClassVar[int]
    BIN_OWNER_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    KEYS_PER_PARTITION_FIELD_NUMBER: _ClassVar[int]
    version: str
    executor: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionStatus]
    tables: _containers.RepeatedScalarFieldContainer[str]
    streams: _containers.RepeatedScalarFieldContainer[str]
    windows: _containers.RepeatedScalarFieldContainer[str]
    procedures: _containers.RepeatedScalarFieldContainer[str]
    triggers: _containers.RepeatedScalarFieldContainer[str]
    counters: _containers.ScalarMap[str, int]
    last_timestamp: int
    views: _containers.RepeatedScalarFieldContainer[str]
    stream_metrics: _containers.RepeatedCompositeFieldContainer[StreamMetrics]
    recovery_seconds: float
    groups: _containers.RepeatedScalarFieldContainer[str]
    indexes: _containers.RepeatedScalarFieldContainer[str]
    bins: int
    bins_per_partition: _containers.RepeatedScalarFieldContainer[int]
    rebalancing: RebalanceProgress
    bin_owner: _containers.RepeatedScalarFieldContainer[int]
    rebalance_interrupted: InterruptedRebalance
    keys_per_partition: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, version: _Optional[str] = ..., executor: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionStatus, _Mapping]]] = ..., tables: _Optional[_Iterable[str]] = ..., streams: _Optional[_Iterable[str]] = ..., windows: _Optional[_Iterable[str]] = ..., procedures: _Optional[_Iterable[str]] = ..., triggers: _Optional[_Iterable[str]] = ..., counters: _Optional[_Mapping[str, int]] = ..., last_timestamp: _Optional[int] = ..., views: _Optional[_Iterable[str]] = ..., stream_metrics: _Optional[_Iterable[_Union[StreamMetrics, _Mapping]]] = ..., recovery_seconds: _Optional[float] = ..., groups: _Optional[_Iterable[str]] = ..., indexes: _Optional[_Iterable[str]] = ..., bins: _Optional[int] = ..., bins_per_partition: _Optional[_Iterable[int]] = ..., rebalancing: _Optional[_Union[RebalanceProgress, _Mapping]] = ..., bin_owner: _Optional[_Iterable[int]] = ..., rebalance_interrupted: _Optional[_Union[InterruptedRebalance, _Mapping]] = ..., keys_per_partition: _Optional[_Iterable[int]] = ...) -> None: ...

class InterruptedRebalance(_message.Message):
    __slots__ = ("strategy", "bins_per_step", "bins_left", "target_owner")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    BINS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    BINS_LEFT_FIELD_NUMBER: _ClassVar[int]
    TARGET_OWNER_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    bins_per_step: int
    bins_left: int
    target_owner: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, strategy: _Optional[str] = ..., bins_per_step: _Optional[int] = ..., bins_left: _Optional[int] = ..., target_owner: _Optional[_Iterable[int]] = ...) -> None: ...

class BinMove(_message.Message):
    __slots__ = ("first_bin", "last_bin", "partition")
    FIRST_BIN_FIELD_NUMBER: _ClassVar[int]
    LAST_BIN_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    first_bin: int
    last_bin: int
    partition: int
    def __init__(self, first_bin: _Optional[int] = ..., last_bin: _Optional[int] = ..., partition: _Optional[int] = ...) -> None: ...

class RebalanceRequest(_message.Message):
    __slots__ = ("moves", "even", "strategy", "bins_per_step", "resume", "partitions")
    MOVES_FIELD_NUMBER: _ClassVar[int]
    EVEN_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    BINS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[BinMove]
    even: bool
    strategy: str
    bins_per_step: int
    resume: bool
    partitions: int
    def __init__(self, moves: _Optional[_Iterable[_Union[BinMove, _Mapping]]] = ..., even: _Optional[bool] = ..., strategy: _Optional[str] = ..., bins_per_step: _Optional[int] = ..., resume: _Optional[bool] = ..., partitions: _Optional[int] = ...) -> None: ...

class RebalanceProgress(_message.Message):
    __slots__ = ("step", "steps", "bins_moved", "bins_total", "rows_moved", "elapsed_seconds", "timestamp", "bins_per_partition", "step_seconds")
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BINS_MOVED_FIELD_NUMBER: _ClassVar[int]
    BINS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ROWS_MOVED_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    BINS_PER_PARTITION_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    step: int
    steps: int
    bins_moved: int
    bins_total: int
    rows_moved: int
    elapsed_seconds: float
    timestamp: int
    bins_per_partition: _containers.RepeatedScalarFieldContainer[int]
    step_seconds: float
    def __init__(self, step: _Optional[int] = ..., steps: _Optional[int] = ..., bins_moved: _Optional[int] = ..., bins_total: _Optional[int] = ..., rows_moved: _Optional[int] = ..., elapsed_seconds: _Optional[float] = ..., timestamp: _Optional[int] = ..., bins_per_partition: _Optional[_Iterable[int]] = ..., step_seconds: _Optional[float] = ...) -> None: ...

class DescribeStreamRequest(_message.Message):
    __slots__ = ("stream", "with_complete_through")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    WITH_COMPLETE_THROUGH_FIELD_NUMBER: _ClassVar[int]
    stream: str
    with_complete_through: bool
    def __init__(self, stream: _Optional[str] = ..., with_complete_through: _Optional[bool] = ...) -> None: ...

class DescribeStreamResponse(_message.Message):
    __slots__ = ("stream", "arrow_schema", "border", "readable", "complete_through")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    BORDER_FIELD_NUMBER: _ClassVar[int]
    READABLE_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_THROUGH_FIELD_NUMBER: _ClassVar[int]
    stream: str
    arrow_schema: bytes
    border: bool
    readable: bool
    complete_through: int
    def __init__(self, stream: _Optional[str] = ..., arrow_schema: _Optional[bytes] = ..., border: _Optional[bool] = ..., readable: _Optional[bool] = ..., complete_through: _Optional[int] = ...) -> None: ...

class ReadStreamRequest(_message.Message):
    __slots__ = ("stream", "from_ts", "to_ts", "max_batches", "format")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FROM_TS_FIELD_NUMBER: _ClassVar[int]
    TO_TS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCHES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    from_ts: int
    to_ts: int
    max_batches: int
    format: RowFormat
    def __init__(self, stream: _Optional[str] = ..., from_ts: _Optional[int] = ..., to_ts: _Optional[int] = ..., max_batches: _Optional[int] = ..., format: _Optional[_Union[RowFormat, str]] = ...) -> None: ...

class ReadStreamResponse(_message.Message):
    __slots__ = ("batches", "more")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[StreamBatch]
    more: bool
    def __init__(self, batches: _Optional[_Iterable[_Union[StreamBatch, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class StageRequest(_message.Message):
    __slots__ = ("stream", "staging_id", "part", "chunk", "data")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STAGING_ID_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    stream: str
    staging_id: str
    part: str
    chunk: int
    data: RowData
    def __init__(self, stream: _Optional[str] = ..., staging_id: _Optional[str] = ..., part: _Optional[str] = ..., chunk: _Optional[int] = ..., data: _Optional[_Union[RowData, _Mapping]] = ...) -> None: ...

class StageResponse(_message.Message):
    __slots__ = ("rows", "staged_bytes")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    STAGED_BYTES_FIELD_NUMBER: _ClassVar[int]
    rows: int
    staged_bytes: int
    def __init__(self, rows: _Optional[int] = ..., staged_bytes: _Optional[int] = ...) -> None: ...

class StagedPart(_message.Message):
    __slots__ = ("part", "chunks", "rows")
    PART_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    part: str
    chunks: int
    rows: int
    def __init__(self, part: _Optional[str] = ..., chunks: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class CommitStagedRequest(_message.Message):
    __slots__ = ("stream", "staging_id", "producer_id", "batch_id", "parts")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STAGING_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    staging_id: str
    producer_id: str
    batch_id: int
    parts: _containers.RepeatedCompositeFieldContainer[StagedPart]
    def __init__(self, stream: _Optional[str] = ..., staging_id: _Optional[str] = ..., producer_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[StagedPart, _Mapping]]] = ...) -> None: ...

class AbortStagedRequest(_message.Message):
    __slots__ = ("stream", "staging_id")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STAGING_ID_FIELD_NUMBER: _ClassVar[int]
    stream: str
    staging_id: str
    def __init__(self, stream: _Optional[str] = ..., staging_id: _Optional[str] = ...) -> None: ...

class AbortStagedResponse(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: int
    def __init__(self, parts: _Optional[int] = ...) -> None: ...
