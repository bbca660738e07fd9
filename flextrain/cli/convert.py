"""``flextrain data convert SRC --out DIR`` and ``flextrain data inspect DIR``: thin wrappers over
:mod:`flextrain.data.convert` (the flags, the progress bar, the printed summary)."""

from __future__ import annotations

import json
import os
import sys

from flextrain.cli.common import CLIError, HelpFormatter


def add_commands(data) -> None:
    """``convert`` and ``inspect`` under the ``data`` subcommands."""
    c = data.add_parser("convert", help="CSV, NumPy, Parquet, JSON lines or an image folder to RecordIO shards",
                        formatter_class=HelpFormatter,
                        description="Convert SRC to RecordIO shards DIR/data-00000, ... and DIR/schema.json. "
                                    "SRC: a .csv, .npy, .npz, .parquet or .jsonl file, a directory of Parquet "
                                    "files, or an image folder (one sub-folder per class).")
    c.add_argument("src", metavar="SRC", help="the data to convert")
    c.add_argument("--out", required=True, metavar="DIR", help="writes the shards and schema.json here")
    c.add_argument("--format", choices=("recordio", "example"), default="recordio",
                   help="recordio: flextrain's raw rows (decode with flextrain.data.rows.decode_rows); "
                        "example: serialized tf.train.Example")
    c.add_argument("--shard-size", type=int, default=10000, metavar="N", help="records per shard")
    c.add_argument("--workers", type=int, default=None, metavar="K",
                   help="processes writing shards (default: min(4, cores))")
    c.add_argument("--overwrite", action="store_true", help="replace the shards and schema of a non-empty DIR")
    c.add_argument("--header", action=_Tristate, nargs=0, default=None,
                   help="CSV: the first line names the columns (--no-header: it is a record; default: detected)")
    c.add_argument("--no-header", dest="header", action=_Tristate, nargs=0, help="CSV: the first line is a record")
    c.add_argument("--field", default="x", metavar="NAME", help="the field name of a .npy array")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(fn=cmd_convert)
    i = data.add_parser("inspect", help="schema, record count and first records of a directory of RecordIO shards",
                        formatter_class=HelpFormatter)
    i.add_argument("dir", metavar="DIR", help="a directory written by `flextrain data convert`, or of RecordIO "
                                              "files, or one RecordIO file (exit 1: the shards disagree with "
                                              "schema.json or hold corrupt chunks)")
    i.add_argument("--head", type=int, default=3, metavar="N", help="records to decode and print")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.add_argument("--no-verify", dest="verify", action="store_false",
                   help="count the records from the chunk headers only, without reading every chunk to check "
                        "its CRC-32 and decoding (a shard with a damaged payload then passes)")
    i.add_argument("--quiet", action="store_true", help="no progress bar while the chunks are checked")
    i.set_defaults(fn=cmd_inspect)


class _Tristate:
    """``--header`` sets True, ``--no-header`` False; neither leaves None (argparse action)."""

    def __new__(cls, option_strings, dest, **kwargs):
        import argparse

        class Action(argparse.Action):
            def __call__(self, parser, namespace, values, option_string=None):
                setattr(namespace, self.dest, not option_string.startswith("--no-"))

        return Action(option_strings, dest, **kwargs)


def cmd_convert(args) -> int:
    from flextrain.data.convert import ConvertOptions, convert
    from flextrain.data.errors import DataError

    if args.shard_size < 1:
        raise CLIError(f"--shard-size must be at least 1, got {args.shard_size}")
    if args.workers is not None and args.workers < 1:
        raise CLIError(f"--workers must be at least 1, got {args.workers}")
    options = ConvertOptions(format=args.format, shard_size=args.shard_size, workers=args.workers,
                             overwrite=args.overwrite, header=args.header, field=args.field)
    show = not args.quiet and sys.stderr.isatty()
    with _Bar(show) as bar:
        try:
            result = convert(args.src, args.out, options, on_open=bar.start, on_shard=bar.advance)
        except DataError as exc:
            raise CLIError(str(exc)) from None
    schema = result.schema
    rate = schema.records / result.seconds if result.seconds else 0.0
    print(f"converted {schema.records} records ({schema.source_kind} -> {schema.format}, {len(schema.fields)} "
          f"field{'s' if len(schema.fields) != 1 else ''}) into {len(schema.shards)} shard"
          f"{'s' if len(schema.shards) != 1 else ''} in {result.out}: {result.bytes / 1e6:.1f} MB, "
          f"{result.seconds:.1f} s, {rate:,.0f} records/s, {result.workers} worker{'s' if result.workers > 1 else ''}")
    for note in schema.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


class _Bar:
    """A rich progress bar on stderr, over the records written (convert: ``start`` gets the source) or the
    bytes checked (inspect: ``start`` gets the total); does nothing when not shown."""

    def __init__(self, show: bool, label: str = "converting", *, bytes_: bool = False):
        self.show, self.label, self.bytes, self.progress, self.task = show, label, bytes_, None, None

    def __enter__(self):
        return self

    def start(self, source) -> None:
        if not self.show:
            return
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeRemainingColumn)

        done = DownloadColumn() if self.bytes else MofNCompleteColumn()
        self.progress = Progress(TextColumn(self.label), BarColumn(), done, TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
        self.progress.start()
        self.task = self.progress.add_task(self.label, total=source if self.bytes else source.num_rows)

    def advance(self, amount: int) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, amount)

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()


def cmd_inspect(args) -> int:
    from flextrain.data.convert import inspect_dir
    from flextrain.data.errors import DataError

    if args.head < 0:
        raise CLIError(f"--head must be 0 or more, got {args.head}")
    with _Bar(not args.quiet and sys.stderr.isatty(), "checking", bytes_=True) as bar:
        try:
            info = inspect_dir(args.dir, head=args.head, verify=args.verify, on_start=bar.start,
                               on_progress=bar.advance)
        except DataError as exc:
            raise CLIError(str(exc)) from None
    # a check that found a problem: shards that disagree with their schema.json, or a damaged chunk
    failed = 1 if info["agrees"] is False or info["corrupt"] else 0
    if args.json:
        print(json.dumps(info))
        return failed
    schema = info["schema"]
    print(f"{info['directory']}: {info['records']} records in {len(info['shards'])} shard"
          f"{'s' if len(info['shards']) != 1 else ''}")
    if schema is None:
        print("no schema.json: records shown as " + ("tf.train.Example" if info["decoded_as"] == "example" else
                                                     "raw bytes"))
    else:
        print(f"format: {schema['format']}  source: {schema['source']} ({schema['source_kind']})")
        print("fields:")
        for f in schema["fields"]:
            print(f"  {f['name']}: {f['dtype']} {f['shape']}")
        if schema.get("class_names") is not None:
            print(f"classes: {', '.join(schema['class_names'])}")
        for note in schema.get("notes", []):
            print(f"note: {note}")
        if info["agrees"]:
            print(f"record count agrees with schema.json ({schema['records']})")
        elif info["agrees"] is False:
            print("record count DISAGREES with schema.json: " + "; ".join(info["disagreements"]))
    if info["corrupt"]:
        files = len({c["name"] for c in info["corrupt"]})
        print(f"CORRUPT: {len(info['corrupt'])} damaged chunk{'s' if len(info['corrupt']) != 1 else ''} in "
              f"{files} shard{'s' if files != 1 else ''} (a task reading one fails):")
        for c in info["corrupt"]:
            print(f"  {os.path.join(info['directory'], c['name'])}: chunk at byte offset {c['offset']}: "
                  f"{c['reason']}")
    elif info["verified"]:
        print("every chunk passes its CRC-32 check and decodes")
    else:
        print("chunks not checked (--no-verify): counted from their headers")
    for shard in info["shards"]:
        print(f"  {shard['name']}: {shard['records']} records, {shard['bytes']} bytes")
    for n, record in enumerate(info["head"]):
        print(f"record {n}:")
        for name, value in record.items():
            print(f"  {name}: {json.dumps(value)}")
    return failed
