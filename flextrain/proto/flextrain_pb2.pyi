from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Position(_message.Message):
    __slots__ = ("round_id", "task_index", "steps_done", "version", "lr_gain", "gradient_noise_scale", "synced")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEPS_DONE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LR_GAIN_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SYNCED_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    task_index: int
    steps_done: int
    version: int
    lr_gain: float
    gradient_noise_scale: float
    synced: bool
    def __init__(self, round_id: _Optional[int] = ..., task_index: _Optional[int] = ..., steps_done: _Optional[int] = ..., version: _Optional[int] = ..., lr_gain: _Optional[float] = ..., gradient_noise_scale: _Optional[float] = ..., synced: _Optional[bool] = ...) -> None: ...

class GetJobSpecRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class GetJobSpecResponse(_message.Message):
    __slots__ = ("job_spec_json", "heartbeat_interval", "ps_addresses", "sample")
    JOB_SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    PS_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    job_spec_json: str
    heartbeat_interval: float
    ps_addresses: _containers.RepeatedScalarFieldContainer[str]
    sample: Task
    def __init__(self, job_spec_json: _Optional[str] = ..., heartbeat_interval: _Optional[float] = ..., ps_addresses: _Optional[_Iterable[str]] = ..., sample: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "host", "pid", "probe", "node_check", "node")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    NODE_CHECK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    host: str
    pid: int
    probe: MicroBatchProbe
    node_check: NodeCheck
    node: str
    def __init__(self, worker_id: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., probe: _Optional[_Union[MicroBatchProbe, _Mapping]] = ..., node_check: _Optional[_Union[NodeCheck, _Mapping]] = ..., node: _Optional[str] = ...) -> None: ...

class NodeCheck(_message.Message):
    __slots__ = ("seconds_per_sample", "samples", "steps", "link_seconds_per_mib")
    SECONDS_PER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    LINK_SECONDS_PER_MIB_FIELD_NUMBER: _ClassVar[int]
    seconds_per_sample: float
    samples: int
    steps: int
    link_seconds_per_mib: float
    def __init__(self, seconds_per_sample: _Optional[float] = ..., samples: _Optional[int] = ..., steps: _Optional[int] = ..., link_seconds_per_mib: _Optional[float] = ...) -> None: ...

class ProbeLinkRequest(_message.Message):
    __slots__ = ("worker_id", "bytes", "rounds")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    bytes: int
    rounds: int
    def __init__(self, worker_id: _Optional[str] = ..., bytes: _Optional[int] = ..., rounds: _Optional[int] = ...) -> None: ...

class ProbeLinkResponse(_message.Message):
    __slots__ = ("store_host", "store_port", "prefix")
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    store_host: str
    store_port: int
    prefix: str
    def __init__(self, store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., prefix: _Optional[str] = ...) -> None: ...

class MicroBatchProbe(_message.Message):
    __slots__ = ("max_micro_batch", "memory_limit", "peak_bytes", "cached", "device")
    MAX_MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    max_micro_batch: int
    memory_limit: int
    peak_bytes: int
    cached: bool
    device: str
    def __init__(self, max_micro_batch: _Optional[int] = ..., memory_limit: _Optional[int] = ..., peak_bytes: _Optional[int] = ..., cached: _Optional[bool] = ..., device: _Optional[str] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("refused",)
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    refused: str
    def __init__(self, refused: _Optional[str] = ...) -> None: ...

class ParkRequest(_message.Message):
    __slots__ = ("worker_id", "pid")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    pid: int
    def __init__(self, worker_id: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class ParkResponse(_message.Message):
    __slots__ = ("action",)
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        WAIT: _ClassVar[ParkResponse.Action]
        TAKEN: _ClassVar[ParkResponse.Action]
        STOP: _ClassVar[ParkResponse.Action]
    WAIT: ParkResponse.Action
    TAKEN: ParkResponse.Action
    STOP: ParkResponse.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: ParkResponse.Action
    def __init__(self, action: _Optional[_Union[ParkResponse.Action, str]] = ...) -> None: ...

class AccelerateRequest(_message.Message):
    __slots__ = ("worker_id", "strategy_json", "search_json")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_JSON_FIELD_NUMBER: _ClassVar[int]
    SEARCH_JSON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    strategy_json: str
    search_json: str
    def __init__(self, worker_id: _Optional[str] = ..., strategy_json: _Optional[str] = ..., search_json: _Optional[str] = ...) -> None: ...

class AccelerateResponse(_message.Message):
    __slots__ = ("action", "strategy_json", "source")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        USE: _ClassVar[AccelerateResponse.Action]
        SEARCH: _ClassVar[AccelerateResponse.Action]
        WAIT: _ClassVar[AccelerateResponse.Action]
    USE: AccelerateResponse.Action
    SEARCH: AccelerateResponse.Action
    WAIT: AccelerateResponse.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_JSON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    action: AccelerateResponse.Action
    strategy_json: str
    source: str
    def __init__(self, action: _Optional[_Union[AccelerateResponse.Action, str]] = ..., strategy_json: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class JoinRendezvousRequest(_message.Message):
    __slots__ = ("worker_id", "position", "reason", "detail", "exited_peers")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    EXITED_PEERS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    position: Position
    reason: str
    detail: str
    exited_peers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., exited_peers: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinRendezvousResponse(_message.Message):
    __slots__ = ("action", "round_id", "rank", "world_size", "store_host", "store_port", "version", "restore_checkpoint", "message", "max_micro_batch", "members_in_sync", "first_task")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        WAIT: _ClassVar[JoinRendezvousResponse.Action]
        TRAIN: _ClassVar[JoinRendezvousResponse.Action]
        STOP: _ClassVar[JoinRendezvousResponse.Action]
    WAIT: JoinRendezvousResponse.Action
    TRAIN: JoinRendezvousResponse.Action
    STOP: JoinRendezvousResponse.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESTORE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    FIRST_TASK_FIELD_NUMBER: _ClassVar[int]
    action: JoinRendezvousResponse.Action
    round_id: int
    rank: int
    world_size: int
    store_host: str
    store_port: int
    version: int
    restore_checkpoint: str
    message: str
    max_micro_batch: int
    members_in_sync: bool
    first_task: Task
    def __init__(self, action: _Optional[_Union[JoinRendezvousResponse.Action, str]] = ..., round_id: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., version: _Optional[int] = ..., restore_checkpoint: _Optional[str] = ..., message: _Optional[str] = ..., max_micro_batch: _Optional[int] = ..., members_in_sync: _Optional[bool] = ..., first_task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "kind", "source", "start", "end", "epoch", "global_batch_size", "model_version")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TRAINING: _ClassVar[Task.Kind]
        EVALUATION: _ClassVar[Task.Kind]
        PREDICTION: _ClassVar[Task.Kind]
    TRAINING: Task.Kind
    EVALUATION: Task.Kind
    PREDICTION: Task.Kind
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    kind: Task.Kind
    source: str
    start: int
    end: int
    epoch: int
    global_batch_size: int
    model_version: int
    def __init__(self, task_id: _Optional[int] = ..., kind: _Optional[_Union[Task.Kind, str]] = ..., source: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., epoch: _Optional[int] = ..., global_batch_size: _Optional[int] = ..., model_version: _Optional[int] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("worker_id", "round_id", "task_index", "position", "kind", "model_version", "ahead", "ahead_count")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    AHEAD_COUNT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    round_id: int
    task_index: int
    position: Position
    kind: Task.Kind
    model_version: int
    ahead: bool
    ahead_count: int
    def __init__(self, worker_id: _Optional[str] = ..., round_id: _Optional[int] = ..., task_index: _Optional[int] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., kind: _Optional[_Union[Task.Kind, str]] = ..., model_version: _Optional[int] = ..., ahead: _Optional[bool] = ..., ahead_count: _Optional[int] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("action", "task", "message", "more")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        RUN: _ClassVar[GetTaskResponse.Action]
        WAIT: _ClassVar[GetTaskResponse.Action]
        END_ROUND: _ClassVar[GetTaskResponse.Action]
        NO_MORE: _ClassVar[GetTaskResponse.Action]
        STOP: _ClassVar[GetTaskResponse.Action]
    RUN: GetTaskResponse.Action
    WAIT: GetTaskResponse.Action
    END_ROUND: GetTaskResponse.Action
    NO_MORE: GetTaskResponse.Action
    STOP: GetTaskResponse.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    action: GetTaskResponse.Action
    task: Task
    message: str
    more: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, action: _Optional[_Union[GetTaskResponse.Action, str]] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., message: _Optional[str] = ..., more: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class ReportTaskRequest(_message.Message):
    __slots__ = ("worker_id", "task_id", "ok", "steps_done", "error", "metric_sums", "samples", "metric_states", "failure")
    class MetricSumsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetricStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetricState
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetricState, _Mapping]] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    STEPS_DONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    METRIC_SUMS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRIC_STATES_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    task_id: int
    ok: bool
    steps_done: int
    error: str
    metric_sums: _containers.ScalarMap[str, float]
    samples: int
    metric_states: _containers.MessageMap[str, MetricState]
    failure: Failure
    def __init__(self, worker_id: _Optional[str] = ..., task_id: _Optional[int] = ..., ok: _Optional[bool] = ..., steps_done: _Optional[int] = ..., error: _Optional[str] = ..., metric_sums: _Optional[_Mapping[str, float]] = ..., samples: _Optional[int] = ..., metric_states: _Optional[_Mapping[str, MetricState]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("kind", "exit_code", "exception", "message", "location", "traceback", "stage", "step")
    KIND_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    kind: str
    exit_code: int
    exception: str
    message: str
    location: str
    traceback: str
    stage: str
    step: int
    def __init__(self, kind: _Optional[str] = ..., exit_code: _Optional[int] = ..., exception: _Optional[str] = ..., message: _Optional[str] = ..., location: _Optional[str] = ..., traceback: _Optional[str] = ..., stage: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class ReportFailureRequest(_message.Message):
    __slots__ = ("worker_id", "failure")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    failure: Failure
    def __init__(self, worker_id: _Optional[str] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ...) -> None: ...

class ReportFailureResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MetricState(_message.Message):
    __slots__ = ("kind", "values")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, kind: _Optional[str] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class ReportTaskResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "position", "loss", "samples", "waiting_for_peers", "stalled_seconds", "skipped_steps", "lr_gain", "gradient_noise_scale", "memory", "compute_seconds", "compute_samples", "ps_traffic", "step", "wait_seconds")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_PEERS_FIELD_NUMBER: _ClassVar[int]
    STALLED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_STEPS_FIELD_NUMBER: _ClassVar[int]
    LR_GAIN_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PS_TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    position: Position
    loss: float
    samples: int
    waiting_for_peers: bool
    stalled_seconds: float
    skipped_steps: int
    lr_gain: float
    gradient_noise_scale: float
    memory: MemorySample
    compute_seconds: float
    compute_samples: int
    ps_traffic: PSTraffic
    step: int
    wait_seconds: float
    def __init__(self, worker_id: _Optional[str] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., loss: _Optional[float] = ..., samples: _Optional[int] = ..., waiting_for_peers: _Optional[bool] = ..., stalled_seconds: _Optional[float] = ..., skipped_steps: _Optional[int] = ..., lr_gain: _Optional[float] = ..., gradient_noise_scale: _Optional[float] = ..., memory: _Optional[_Union[MemorySample, _Mapping]] = ..., compute_seconds: _Optional[float] = ..., compute_samples: _Optional[int] = ..., ps_traffic: _Optional[_Union[PSTraffic, _Mapping]] = ..., step: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class PSTraffic(_message.Message):
    __slots__ = ("pushes", "push_seconds", "push_bytes", "pulls", "pull_seconds", "pull_bytes")
    PUSHES_FIELD_NUMBER: _ClassVar[int]
    PUSH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PUSH_BYTES_FIELD_NUMBER: _ClassVar[int]
    PULLS_FIELD_NUMBER: _ClassVar[int]
    PULL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PULL_BYTES_FIELD_NUMBER: _ClassVar[int]
    pushes: int
    push_seconds: float
    push_bytes: int
    pulls: int
    pull_seconds: float
    pull_bytes: int
    def __init__(self, pushes: _Optional[int] = ..., push_seconds: _Optional[float] = ..., push_bytes: _Optional[int] = ..., pulls: _Optional[int] = ..., pull_seconds: _Optional[float] = ..., pull_bytes: _Optional[int] = ...) -> None: ...

class MemorySample(_message.Message):
    __slots__ = ("step", "device", "used_bytes", "peak_bytes", "reserved_bytes")
    STEP_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    step: int
    device: str
    used_bytes: int
    peak_bytes: int
    reserved_bytes: int
    def __init__(self, step: _Optional[int] = ..., device: _Optional[str] = ..., used_bytes: _Optional[int] = ..., peak_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("end_round", "stop", "job_over")
    END_ROUND_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    JOB_OVER_FIELD_NUMBER: _ClassVar[int]
    end_round: bool
    stop: bool
    job_over: bool
    def __init__(self, end_round: _Optional[bool] = ..., stop: _Optional[bool] = ..., job_over: _Optional[bool] = ...) -> None: ...

class ReportCheckpointRequest(_message.Message):
    __slots__ = ("worker_id", "path", "position", "final", "stop", "memory", "ledger_json")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    LEDGER_JSON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    path: str
    position: Position
    final: bool
    stop: bool
    memory: bool
    ledger_json: str
    def __init__(self, worker_id: _Optional[str] = ..., path: _Optional[str] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., final: _Optional[bool] = ..., stop: _Optional[bool] = ..., memory: _Optional[bool] = ..., ledger_json: _Optional[str] = ...) -> None: ...

class ReportCheckpointResponse(_message.Message):
    __slots__ = ("ledger_json",)
    LEDGER_JSON_FIELD_NUMBER: _ClassVar[int]
    ledger_json: str
    def __init__(self, ledger_json: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("status_json",)
    STATUS_JSON_FIELD_NUMBER: _ClassVar[int]
    status_json: str
    def __init__(self, status_json: _Optional[str] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("accepted", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class ScaleRequest(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: int
    def __init__(self, workers: _Optional[int] = ...) -> None: ...

class ScaleResponse(_message.Message):
    __slots__ = ("accepted", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class SuspendRequest(_message.Message):
    __slots__ = ("suspend", "reason")
    SUSPEND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    suspend: bool
    reason: str
    def __init__(self, suspend: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class SuspendResponse(_message.Message):
    __slots__ = ("accepted", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...
