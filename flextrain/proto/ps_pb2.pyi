from flextrain.proto import flextrain_pb2 as _flextrain_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OptimizerConfig(_message.Message):
    __slots__ = ("name", "hyper")
    class HyperEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    HYPER_FIELD_NUMBER: _ClassVar[int]
    name: str
    hyper: _containers.ScalarMap[str, float]
    def __init__(self, name: _Optional[str] = ..., hyper: _Optional[_Mapping[str, float]] = ...) -> None: ...

class SyncConfig(_message.Message):
    __slots__ = ("mode", "grads_to_wait", "version_tolerance", "staleness_lr", "max_staleness")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SYNC: _ClassVar[SyncConfig.Mode]
        ASYNC: _ClassVar[SyncConfig.Mode]
    SYNC: SyncConfig.Mode
    ASYNC: SyncConfig.Mode
    MODE_FIELD_NUMBER: _ClassVar[int]
    GRADS_TO_WAIT_FIELD_NUMBER: _ClassVar[int]
    VERSION_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    STALENESS_LR_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    mode: SyncConfig.Mode
    grads_to_wait: int
    version_tolerance: int
    staleness_lr: bool
    max_staleness: int
    def __init__(self, mode: _Optional[_Union[SyncConfig.Mode, str]] = ..., grads_to_wait: _Optional[int] = ..., version_tolerance: _Optional[int] = ..., staleness_lr: _Optional[bool] = ..., max_staleness: _Optional[int] = ...) -> None: ...

class ConfigureRequest(_message.Message):
    __slots__ = ("optimizer", "sync", "num_ps")
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    NUM_PS_FIELD_NUMBER: _ClassVar[int]
    optimizer: OptimizerConfig
    sync: SyncConfig
    num_ps: int
    def __init__(self, optimizer: _Optional[_Union[OptimizerConfig, _Mapping]] = ..., sync: _Optional[_Union[SyncConfig, _Mapping]] = ..., num_ps: _Optional[int] = ...) -> None: ...

class ConfigureResponse(_message.Message):
    __slots__ = ("optimizer", "sync", "version")
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    optimizer: OptimizerConfig
    sync: SyncConfig
    version: int
    def __init__(self, optimizer: _Optional[_Union[OptimizerConfig, _Mapping]] = ..., sync: _Optional[_Union[SyncConfig, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ...) -> None: ...

class DenseLayout(_message.Message):
    __slots__ = ("tensors", "total_bytes", "layout_id")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_ID_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    layout_id: int
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., layout_id: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TableSpec(_message.Message):
    __slots__ = ("name", "dim", "dtype", "initializer", "init_args", "seed")
    class InitArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    INITIALIZER_FIELD_NUMBER: _ClassVar[int]
    INIT_ARGS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    dtype: str
    initializer: str
    init_args: _containers.ScalarMap[str, float]
    seed: int
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., dtype: _Optional[str] = ..., initializer: _Optional[str] = ..., init_args: _Optional[_Mapping[str, float]] = ..., seed: _Optional[int] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("shard_index", "num_ps", "version", "incarnation", "dense_initialized", "layout", "tables", "table_rows", "optimizer", "sync", "pending_pushes")
    class TableRowsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_PS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DENSE_INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    TABLE_ROWS_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    PENDING_PUSHES_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    num_ps: int
    version: int
    incarnation: int
    dense_initialized: bool
    layout: DenseLayout
    tables: _containers.RepeatedCompositeFieldContainer[TableSpec]
    table_rows: _containers.ScalarMap[str, int]
    optimizer: OptimizerConfig
    sync: SyncConfig
    pending_pushes: int
    def __init__(self, shard_index: _Optional[int] = ..., num_ps: _Optional[int] = ..., version: _Optional[int] = ..., incarnation: _Optional[int] = ..., dense_initialized: _Optional[bool] = ..., layout: _Optional[_Union[DenseLayout, _Mapping]] = ..., tables: _Optional[_Iterable[_Union[TableSpec, _Mapping]]] = ..., table_rows: _Optional[_Mapping[str, int]] = ..., optimizer: _Optional[_Union[OptimizerConfig, _Mapping]] = ..., sync: _Optional[_Union[SyncConfig, _Mapping]] = ..., pending_pushes: _Optional[int] = ...) -> None: ...

class InitDenseChunk(_message.Message):
    __slots__ = ("layout", "data")
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    layout: DenseLayout
    data: bytes
    def __init__(self, layout: _Optional[_Union[DenseLayout, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class InitDenseResponse(_message.Message):
    __slots__ = ("initialized", "version", "layout", "incarnation")
    INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    initialized: bool
    version: int
    layout: DenseLayout
    incarnation: int
    def __init__(self, initialized: _Optional[bool] = ..., version: _Optional[int] = ..., layout: _Optional[_Union[DenseLayout, _Mapping]] = ..., incarnation: _Optional[int] = ...) -> None: ...

class DeclareTablesRequest(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableSpec]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableSpec, _Mapping]]] = ...) -> None: ...

class DeclareTablesResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableSpec]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableSpec, _Mapping]]] = ...) -> None: ...

class PullDenseRequest(_message.Message):
    __slots__ = ("known_version", "known_incarnation", "wait_seconds", "chunk_bytes")
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    KNOWN_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    known_incarnation: int
    wait_seconds: float
    chunk_bytes: int
    def __init__(self, known_version: _Optional[int] = ..., known_incarnation: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class PullDenseChunk(_message.Message):
    __slots__ = ("unchanged", "version", "incarnation", "layout", "data")
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    unchanged: bool
    version: int
    incarnation: int
    layout: DenseLayout
    data: bytes
    def __init__(self, unchanged: _Optional[bool] = ..., version: _Optional[int] = ..., incarnation: _Optional[int] = ..., layout: _Optional[_Union[DenseLayout, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class PullEmbeddingRequest(_message.Message):
    __slots__ = ("table", "ids", "chunk_bytes")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: _flextrain_pb2.Tensor
    chunk_bytes: int
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[_Union[_flextrain_pb2.Tensor, _Mapping]] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class PullEmbeddingChunk(_message.Message):
    __slots__ = ("rows", "version")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    rows: _flextrain_pb2.Tensor
    version: int
    def __init__(self, rows: _Optional[_Union[_flextrain_pb2.Tensor, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

class PushHeader(_message.Message):
    __slots__ = ("client_id", "seq", "base_version", "layout_id", "dense_bytes", "absent", "step", "sparse_blocks")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_ID_FIELD_NUMBER: _ClassVar[int]
    DENSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ABSENT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SPARSE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    seq: int
    base_version: int
    layout_id: int
    dense_bytes: int
    absent: _containers.RepeatedScalarFieldContainer[str]
    step: TaskStep
    sparse_blocks: int
    def __init__(self, client_id: _Optional[str] = ..., seq: _Optional[int] = ..., base_version: _Optional[int] = ..., layout_id: _Optional[int] = ..., dense_bytes: _Optional[int] = ..., absent: _Optional[_Iterable[str]] = ..., step: _Optional[_Union[TaskStep, _Mapping]] = ..., sparse_blocks: _Optional[int] = ...) -> None: ...

class TaskStep(_message.Message):
    __slots__ = ("task_id", "start", "end")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    start: int
    end: int
    def __init__(self, task_id: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class SparseBlock(_message.Message):
    __slots__ = ("table", "ids", "values")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: _flextrain_pb2.Tensor
    values: _flextrain_pb2.Tensor
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[_Union[_flextrain_pb2.Tensor, _Mapping]] = ..., values: _Optional[_Union[_flextrain_pb2.Tensor, _Mapping]] = ...) -> None: ...

class PushChunk(_message.Message):
    __slots__ = ("header", "dense", "sparse")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    header: PushHeader
    dense: bytes
    sparse: SparseBlock
    def __init__(self, header: _Optional[_Union[PushHeader, _Mapping]] = ..., dense: _Optional[bytes] = ..., sparse: _Optional[_Union[SparseBlock, _Mapping]] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("accepted", "version", "message", "incarnation", "applied", "duplicate")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    version: int
    message: str
    incarnation: int
    applied: bool
    duplicate: bool
    def __init__(self, accepted: _Optional[bool] = ..., version: _Optional[int] = ..., message: _Optional[str] = ..., incarnation: _Optional[int] = ..., applied: _Optional[bool] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class TaskProgressRequest(_message.Message):
    __slots__ = ("task_ids",)
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, task_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TaskProgressResponse(_message.Message):
    __slots__ = ("accepted_until",)
    ACCEPTED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    accepted_until: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, accepted_until: _Optional[_Iterable[int]] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushResponse(_message.Message):
    __slots__ = ("applied", "version")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    version: int
    def __init__(self, applied: _Optional[bool] = ..., version: _Optional[int] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("path", "version")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    version: int
    def __init__(self, path: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...
