"""Sharding and writing: :func:`convert` turns a source into RecordIO shards plus ``schema.json``.

Shards are ``DIR/data-00000``, ``DIR/data-00001``, ... (ElasticDL's names),
each holding ``shard_size`` consecutive records (the last one the rest).
Shard ``i`` depends only on rows ``[i * shard_size, (i + 1) * shard_size)``,
so the output is byte for byte the same whatever the number of workers.
Each shard is written to a dot-file (``.data-00000.tmp``) and renamed when
complete, so a crash never leaves a partial shard under a final name;
``schema.json`` is written last, the same way.

Workers are a process pool (fork where available: the parsed source is
shared, not copied); each writes whole shards. A CSV file is parsed by the
workers themselves: the calling process only finds its line ends
(:mod:`~flextrain.data.convert.csvsplit`) and hands each worker a shard's
byte range. A worker parses its range, infers its columns' types and writes
the shard with them under its temporary name; once every shard is written
the types merge (int64 < float64 < string) and a shard whose types were
narrower than the file's is parsed and written again with the file's, so
each shard is what the whole-file types give. Other tabular sources (and a
CSV file with quotes) are parsed once, in the calling process; the workers
decode images, encode rows, compress and write.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from flextrain.data.convert import csvsplit
from flextrain.data.convert.base import Source
from flextrain.data.convert.sources import open_source, source_kind
from flextrain.data.errors import DataError
from flextrain.data.recordio import Compressor, RecordIOWriter
from flextrain.data.rows import FORMATS, SCHEMA_FILE, Field, Schema, encode_rows, save_schema

__all__ = ["ConvertOptions", "ConvertResult", "convert", "shard_name", "default_workers"]

SHARD_PATTERN = re.compile(r"data-\d{5,}")
_MAX_CHUNK_SIZE = 1024 * 1024  # small chunks keep ranged reads of a shard cheap


def shard_name(index: int) -> str:
    return f"data-{index:05d}"


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert: record ``format`` (``recordio`` raw rows or ``example``), records per shard,
    pool size (None: min(4, cores)), whether to replace the shards of a non-empty output directory,
    a CSV file's ``header`` (None: detect) and the field name of a ``.npy`` array."""

    format: str = "recordio"
    shard_size: int = 10000
    workers: int | None = None
    overwrite: bool = False
    header: bool | None = None
    field: str = "x"
    compressor: Compressor = Compressor.SNAPPY

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown record format {self.format!r} (one of {', '.join(FORMATS)})")
        if self.shard_size < 1:
            raise ValueError(f"shard size must be at least 1, got {self.shard_size}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")


@dataclass(frozen=True)
class ConvertResult:
    """What :func:`convert` wrote: the schema (with counts), bytes on disk, seconds taken, workers used."""

    out: str
    schema: Schema
    bytes: int
    seconds: float
    workers: int


def convert(src: str | os.PathLike[str], out: str | os.PathLike[str], options: ConvertOptions = ConvertOptions(), *,
            on_shard: Callable[[int], None] | None = None, on_open: Callable[[Source], None] | None = None
            ) -> ConvertResult:
    """Convert ``src`` into shards and ``schema.json`` under ``out`` (created if missing).

    ``on_open(source)`` is called once the source is read and checked (a CSV file parsed by the workers:
    once its records are counted; its ``fields`` are empty then, their types known only at the end);
    ``on_shard(records)`` in this process as each shard is complete. Raises DataError naming the problem:
    the source's (see :func:`~flextrain.data.convert.sources.open_source`), or a non-empty ``out`` without
    ``overwrite``.
    """
    started = time.perf_counter()
    src, out = os.fspath(src), os.fspath(out)
    created = not os.path.lexists(out)
    _prepare_out(src, out, overwrite=options.overwrite)
    try:
        return _convert(src, out, options, started, on_shard=on_shard, on_open=on_open)
    except BaseException:
        if created:  # a failed conversion leaves no directory of its own behind (what it held was ours)
            shutil.rmtree(out, ignore_errors=True)
        else:  # nor shards in the user's: _prepare_out left none but those this run wrote
            for name in os.listdir(out):
                if SHARD_PATTERN.fullmatch(name):
                    os.remove(os.path.join(out, name))
        raise


def _convert(src: str, out: str, options: ConvertOptions, started: float, *, on_shard, on_open) -> ConvertResult:
    plan = csvsplit.plan_csv(src, header=options.header) if source_kind(src) == "csv" else None
    source = Source("csv", src, (), plan.num_rows) if plan else \
        open_source(src, header=options.header, field=options.field)
    if on_open:
        on_open(source)
    schema = _schema(source.fields, source, options)
    tasks = csvsplit.shard_tasks(plan, options.shard_size) if plan else \
        [(i, lo, min(lo + options.shard_size, source.num_rows))
         for i, lo in enumerate(range(0, source.num_rows, options.shard_size))]
    workers = min(options.workers or default_workers(), len(tasks))
    job = (plan or source, schema, out, options.compressor)
    done: dict[int, tuple[int, int]] = {}
    try:
        with _Pool(workers, job) as pool:
            if plan is None:
                for index, count, size in pool.imap(_write_shard, tasks):
                    done[index] = (count, size)
                    if on_shard:
                        on_shard(count)
            else:
                schema = _csv_shards(pool, plan, tasks, schema, out, done, on_shard)
    finally:
        _JOB.clear()
        for name in os.listdir(out):  # what a failed shard left behind
            if name.startswith(".data-") and name.endswith(".tmp"):
                os.remove(os.path.join(out, name))
    shards = tuple((shard_name(i), done[i][0]) for i in range(len(tasks)))
    schema = replace(schema, records=sum(c for _, c in shards), shards=shards)
    save_schema(out, schema)
    return ConvertResult(out=out, schema=schema, bytes=sum(s for _, s in done.values()),
                         seconds=time.perf_counter() - started, workers=workers)


def _schema(fields, source: Source, options: ConvertOptions) -> Schema:
    schema = Schema(fields=tuple(fields), format=options.format, source=os.path.abspath(source.path),
                    source_kind=source.kind, class_names=source.class_names)
    return example_schema(schema) if options.format == "example" else schema


def _csv_shards(pool, plan, tasks, schema: Schema, out: str, done: dict, on_shard) -> Schema:
    """Every shard written with its own types, then those narrower than the file's written again;
    the shards left under their temporary names; the schema with the file's types."""
    kinds = {}
    for index, local, count, size in pool.imap(_write_csv_shard, tasks):  # in order: the first bad line raises
        kinds[index], done[index] = local, (count, size)
        if on_shard:
            on_shard(count)
    merged = csvsplit.merge_kinds(list(kinds.values()))
    again = [(*task, merged) for task in tasks if kinds[task[0]] != merged]
    for index, _, count, size in pool.imap(_write_csv_shard, again):
        done[index] = (count, size)
    for index in done:
        os.replace(os.path.join(out, _tmp_name(index)), os.path.join(out, shard_name(index)))
    schema = replace(schema, fields=tuple(Field(n, k) for n, k in zip(plan.names, merged)), notes=())
    return example_schema(schema) if schema.format == "example" else schema


def _csv_fields(names, kinds, fmt: str) -> tuple[Field, ...]:
    fields = tuple(Field(name, kind) for name, kind in zip(names, kinds))
    return example_schema(Schema(fields=fields)).fields if fmt == "example" else fields


def _tmp_name(index: int) -> str:
    return f".{shard_name(index)}.tmp"


class _Pool:
    """``imap`` over ``workers`` processes (fork where available), or in this process for one."""

    def __init__(self, workers: int, job):
        self.workers, self.job, self.pool = workers, job, None

    def __enter__(self):
        _init(self.job)
        if self.workers > 1:
            ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
            self.pool = ctx.Pool(self.workers, initializer=_init, initargs=(self.job,))
        return self

    def imap(self, fn, tasks):
        return self.pool.imap(fn, tasks) if self.pool else map(fn, tasks)

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def _prepare_out(src: str, out: str, *, overwrite: bool) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise DataError(f"output {out} exists and is not a directory")
    if os.path.lexists(src) and os.path.realpath(src) == os.path.realpath(out):
        raise DataError(f"the output directory is the source itself: {out}")
    os.makedirs(out, exist_ok=True)
    names = sorted(n for n in os.listdir(out))
    if names and not overwrite:
        raise DataError(f"output directory {out} is not empty ({len(names)} entr{'ies' if len(names) > 1 else 'y'}, "
                        f"e.g. {names[0]}); pass --overwrite to replace its shards and schema")
    for name in names:  # --overwrite: the shards and schema of an earlier conversion
        if SHARD_PATTERN.fullmatch(name) or name == SCHEMA_FILE:
            os.remove(os.path.join(out, name))


def example_schema(schema: Schema) -> Schema:
    """The schema of ``format: example`` records: float64 fields are float32 (the one float kind a
    tf.train.Example holds), noted in ``notes``."""
    fields, notes = [], []
    for f in schema.fields:
        if f.dtype == "float64":
            notes.append(f"field {f.name!r}: float64 values stored as float32 (tf.train.Example holds float32 only)")
            f = Field(f.name, "float32", f.shape)
        fields.append(f)
    return replace(schema, fields=tuple(fields), notes=tuple(notes))


def encode_examples(columns, schema: Schema) -> list[bytes]:
    """One serialized tf.train.Example per row: a feature per field, values flattened (ints, bools and
    unsigned ints as int64, floats as float32, string/bytes as one bytes value)."""
    from flextrain.data.example import encode_example

    n = len(columns[schema.fields[0].name]) if schema.fields else 0
    out = []
    for i in range(n):
        features, empty = {}, []
        for f in schema.fields:
            value = columns[f.name][i]
            if f.dtype in ("string", "bytes"):
                features[f.name] = [value]
            else:
                arr = np.asarray(value).reshape(-1)
                if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
                    raise ValueError(f"row {i}: field {f.name!r} holds {arr.max()}, beyond a tf.train.Example's int64")
                if not arr.size:  # an empty list: a feature of the right kind without values
                    empty.append((f.name, "float_list" if arr.dtype.kind == "f" else "int64_list"))
                    continue
                features[f.name] = arr if arr.dtype.kind == "f" else arr.astype(np.int64)
        out.append(_with_empty(encode_example(features), empty) if empty else encode_example(features))
    return out


def _with_empty(record: bytes, empty: list[tuple[str, str]]) -> bytes:
    from flextrain.proto import example_pb2

    example = example_pb2.Example.FromString(record)
    for name, kind in empty:
        getattr(example.features.feature[name], kind).SetInParent()
    return example.SerializeToString(deterministic=True)


# ---- pool workers -------------------------------------------------------------------------
_JOB: dict = {}


def _init(job) -> None:
    _JOB["job"] = job


def _write_shard(task: tuple[int, int, int]) -> tuple[int, int, int]:
    index, start, end = task
    source, schema, out, compressor = _JOB["job"]
    columns = source.read(start, end)
    try:
        records = encode_examples(columns, schema) if schema.format == "example" else encode_rows(columns, schema)
    except ValueError as exc:
        raise DataError(f"{source.path}, records {start}..{end - 1}: {exc}") from None
    final = os.path.join(out, shard_name(index))
    _write_records(os.path.join(out, _tmp_name(index)), records, compressor)
    os.replace(os.path.join(out, _tmp_name(index)), final)
    return index, len(records), os.path.getsize(final)


def _write_records(path: str, records: list[bytes], compressor: Compressor) -> int:
    with RecordIOWriter(path, compressor=compressor, max_chunk_size=_MAX_CHUNK_SIZE) as writer:
        for record in records:
            writer.write(record)
    return os.path.getsize(path)


def _write_csv_shard(task) -> tuple[int, tuple[str, ...], int, int]:
    """Parse one shard's byte range, encode it with ``kinds`` (given: the file's; else its own, inferred),
    write it under its temporary name: ``(index, kinds, records, bytes)``."""
    index, count, start, end, line, *given = task
    plan, schema, out, compressor = _JOB["job"]
    rows = csvsplit.parse_range(plan.path, csvsplit.read_range(plan.path, start, end), start, line,
                                width=plan.width, first_line=plan.first_line)
    if len(rows) != count:  # the plan and the csv module disagree on what a record is: never expected
        raise DataError(f"{plan.path}, line {line}: {len(rows)} records where {count} were counted")
    kinds, columns = csvsplit.parse_columns(rows, plan.names, given[0] if given else None)
    schema = replace(schema, fields=_csv_fields(plan.names, kinds, schema.format))
    try:
        records = encode_examples(columns, schema) if schema.format == "example" else encode_rows(columns, schema)
    except ValueError as exc:
        raise DataError(f"{plan.path}, line {line} on: {exc}") from None
    return index, kinds, len(records), _write_records(os.path.join(out, _tmp_name(index)), records, compressor)
