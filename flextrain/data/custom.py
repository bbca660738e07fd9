"""A model-zoo module's own data reader (ElasticDL's ``custom_data_reader``) as a flextrain data source.

A module may define ``custom_data_reader(data_origin, records_per_task=None, **kwargs)``
returning a reader with

- ``create_shards()``: ``{shard_name: (start, num_records)}`` (ElasticDL's form) or a
  list of ``(shard_name, start, num_records)`` tuples;
- ``read_records(task)``: the records of ``task`` (``task.shard_name``, ``task.start``,
  ``task.end``, ``task.type``/``task.mode``: ``"training"``, ``"evaluation"`` or
  ``"prediction"``), exactly ``end - start`` of them, in any form ``feed`` accepts;
- optionally ``records_output_types`` and ``metadata`` (ElasticDL's TensorFlow readers):
  accepted and not used.

``data_origin`` is the data string the user gave (``--training-data`` and so on); it
need not be a path, the reader interprets it. :class:`CustomSource` wraps one reader:
the master plans its tasks from :meth:`CustomSource.shards` (``Shard(shard_name, start,
start + count)``), workers read them with :meth:`CustomSource.read`. Whatever the
user's reader does wrong is a :class:`CustomReaderError` (a :class:`DataError`) naming
the module, the call and *their* exception, so the job fails at once instead of timing out.
"""

from __future__ import annotations

import inspect
import itertools
import operator
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flextrain.data.errors import DataError
from flextrain.data.sources import DataOptions, Shard, make_shards

__all__ = ["CustomReaderError", "ReaderTask", "CustomSource", "custom_source", "plan_shards",
           "clear_custom_sources"]

_MODES = ("training", "evaluation", "prediction")
_SHOWN = 5  # records of a shard list quoted in a message


class CustomReaderError(DataError):
    """The module's ``custom_data_reader`` (or the reader it returned) failed or broke the contract."""


@dataclass(frozen=True)
class ReaderTask:
    """What ``read_records(task)`` is given: records ``[start, end)`` of ``shard_name``."""

    shard_name: str
    start: int
    end: int
    type: str  # "training", "evaluation" or "prediction" (ElasticDL's task.type)

    @property
    def mode(self) -> str:
        return self.type

    @property
    def source(self) -> str:  # flextrain's name for the shard
        return self.shard_name


def _raised(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _module_file(fn: Callable) -> str:
    """The file of the module that defines ``fn`` (its module name if it has none)."""
    name = getattr(fn, "__module__", None) or "the module"
    return getattr(sys.modules.get(name), "__file__", None) or name


def _accepts(fn: Callable, keyword: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: try it
        return True
    return any(p.name == keyword and p.kind is not p.POSITIONAL_ONLY or p.kind is p.VAR_KEYWORD for p in params)


def _count(value: Any) -> int | None:
    """``value`` as a record index or count (any integer type but bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


class CustomSource:
    """The reader ``factory(data_origin, records_per_task=...)`` returns, checked at every turn.

    ``what`` names the data in messages (``"training data"``). The factory is called here,
    once; an exception from it, or a returned object without ``create_shards`` and
    ``read_records``, is a :class:`CustomReaderError`.
    """

    def __init__(self, factory: Callable, data_origin: str, *, what: str = "data",
                 records_per_task: int | None = None) -> None:
        self.data_origin, self.what = data_origin, what
        self.where = os.path.basename(_module_file(factory))
        self.call = f"custom_data_reader(data_origin={data_origin!r})"
        kwargs = {"records_per_task": records_per_task} if _accepts(factory, "records_per_task") else {}
        try:
            reader = factory(data_origin, **kwargs)
        except Exception as exc:
            raise CustomReaderError(f"{self.where}: {self.call} for the {what} raised {_raised(exc)}") from exc
        missing = [m for m in ("create_shards", "read_records") if not callable(getattr(reader, m, None))]
        if missing:
            raise CustomReaderError(
                f"{self.where}: {self.call} returned {'None' if reader is None else type(reader).__name__}, "
                f"which has no {' and no '.join(f'{m}()' for m in missing)}; a data reader must have "
                "create_shards() -> {shard_name: (start, num_records)} and read_records(task) -> records")
        self.reader = reader
        self.metadata = getattr(reader, "metadata", None)  # ElasticDL's TF readers: not used by flextrain
        self._shards: list[Shard] | None = None

    def shards(self) -> list[Shard]:
        """``create_shards()`` as shards (computed once): ``Shard(shard_name, start, start + count)``,
        empty ones left out; a CustomReaderError if it raised, returned something else than a dict or
        list of such triples, gave a negative start or count, or no records at all."""
        if self._shards is None:
            self._shards = self._plan()
        return list(self._shards)

    def _plan(self) -> list[Shard]:
        call = f"{self.where}: create_shards() of {self.call}"
        try:
            planned = self.reader.create_shards()
        except Exception as exc:
            raise CustomReaderError(f"{call} raised {_raised(exc)}") from exc
        if isinstance(planned, Mapping):
            entries = [(name, *value) if isinstance(value, tuple | list) else (name, value)
                       for name, value in planned.items()]
        elif isinstance(planned, list | tuple):
            entries = [tuple(e) if isinstance(e, tuple | list) else (e,) for e in planned]
        else:
            raise CustomReaderError(f"{call} returned {'None' if planned is None else type(planned).__name__}; "
                                    "expected a dict {shard_name: (start, num_records)} or a list of "
                                    "(shard_name, start, num_records)")
        shards = []
        for entry in entries:
            if len(entry) != 3 or not isinstance(entry[0], str) or not entry[0]:
                raise CustomReaderError(f"{call} gave the shard {_show(entry)}; each shard must be a name "
                                        "(a non-empty string) with (start, num_records)")
            name, start, count = entry[0], _count(entry[1]), _count(entry[2])
            if start is None or count is None:
                raise CustomReaderError(f"{call}: shard {name!r} has start {entry[1]!r} and num_records "
                                        f"{entry[2]!r}; both must be integers")
            if start < 0 or count < 0:
                raise CustomReaderError(f"{call}: shard {name!r} has a negative "
                                        f"{'start' if start < 0 else 'num_records'} ({start}, {count})")
            if count:
                shards.append(Shard(name, start, start + count))
        if not shards:
            raise CustomReaderError(f"{call} gave no records for the {self.what} "
                                    f"({len(entries)} shard{'s' if len(entries) != 1 else ''}, all empty)")
        return shards

    def read(self, shard_name: str, start: int, end: int, *, mode: str = "training") -> list:
        """``read_records(task)`` for records ``[start, end)`` of ``shard_name``, as a list of exactly
        ``end - start`` records (CustomReaderError else, naming the shard and the range)."""
        mode = str(getattr(mode, "value", mode))
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, not {mode!r}")
        task = ReaderTask(shard_name, start, end, mode)
        what = f"{self.where}: read_records(task) of {self.call} for records [{start}, {end}) of shard {shard_name!r}"
        want = end - start
        try:
            returned = self.reader.read_records(task)
            try:
                records = iter(returned)
            except TypeError:
                raise CustomReaderError(f"{what} returned {'None' if returned is None else type(returned).__name__}, "
                                        "not an iterable of records") from None
            records = list(itertools.islice(records, want + 1))
        except CustomReaderError:
            raise
        except Exception as exc:  # from the call or while iterating a generator
            raise CustomReaderError(f"{what} raised {_raised(exc)}") from exc
        if len(records) != want:
            got = f"more than {want}" if len(records) > want else str(len(records))
            raise CustomReaderError(f"{what} returned {got} records; it must return exactly end - start = {want}")
        return records


def _show(entry: tuple) -> str:
    text = repr(entry[0] if len(entry) == 1 else entry)
    return text if len(text) <= 80 else text[:77] + "..."


_sources: dict[tuple[Callable, str], CustomSource] = {}
_lock = threading.Lock()


def custom_source(factory: Callable, data_origin: str, *, what: str = "data",
                  records_per_task: int | None = None) -> CustomSource:
    """The process's one :class:`CustomSource` for ``factory`` and ``data_origin`` (made on first use;
    a factory that fails is called again next time)."""
    key = (factory, data_origin)
    with _lock:
        source = _sources.get(key)
    if source is None:
        source = CustomSource(factory, data_origin, what=what, records_per_task=records_per_task)
        with _lock:
            source = _sources.setdefault(key, source)
    return source


def clear_custom_sources() -> None:
    """Forget every cached reader (tests)."""
    with _lock:
        _sources.clear()


def plan_shards(data: str, *, what: str, reader: Callable | None = None, options: DataOptions | None = None,
                skipped: list[str] | None = None, records_per_task: int | None = None) -> list[Shard]:
    """The shards of ``data``: ``reader``'s (a module's ``custom_data_reader``) if given, else
    :func:`~flextrain.data.sources.make_shards`'s. The master, the submission checks and preflight plan with it."""
    if reader is None:
        return make_shards(data, what=what, options=options, skipped=skipped)
    return custom_source(reader, data, what=what, records_per_task=records_per_task).shards()
