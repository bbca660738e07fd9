"""``flextrain data digits|ctr``: write the demo data sets (train/ and validation/ RecordIO files);
``data convert|inspect`` are in flextrain.cli.convert."""

from __future__ import annotations

import os

from flextrain.cli import convert
from flextrain.cli.common import CLIError, HelpFormatter


def add_commands(sub) -> None:
    """The ``data`` subcommand and its ``digits``, ``ctr``, ``convert`` and ``inspect`` subcommands."""
    data = sub.add_parser("data", help="write demo data sets, convert data to RecordIO, inspect it").add_subparsers(
        dest="dataset", required=True)
    d = data.add_parser("digits", help="scikit-learn's handwritten digits as RecordIO train/validation files",
                        formatter_class=HelpFormatter)
    d.add_argument("--out", required=True, metavar="DIR", help="writes DIR/train and DIR/validation")
    d.add_argument("--validation-fraction", type=float, default=0.2, metavar="F",
                   help="share of the records held out for validation, between 0 and 1")
    d.add_argument("--seed", type=int, default=0, metavar="N", help="seeds the train/validation split")
    d.add_argument("--format", choices=("raw", "example"), default="raw",
                   help="raw: 65-byte records (64 pixels + label); example: serialized tf.train.Example "
                        "with features image (64 floats) and label (int64)")
    d.set_defaults(fn=cmd_data_digits)
    d = data.add_parser("ctr", help="a synthetic click log (categorical ids + dense features) as RecordIO",
                        formatter_class=HelpFormatter)
    d.add_argument("--out", required=True, metavar="DIR", help="writes DIR/train and DIR/validation")
    d.add_argument("--rows", type=int, default=20000, metavar="N", help="records to generate (at least 2)")
    d.add_argument("--validation-fraction", type=float, default=0.2, metavar="F",
                   help="share of the records held out for validation, between 0 and 1")
    d.add_argument("--seed", type=int, default=0, metavar="N", help="seeds the generator")
    d.set_defaults(fn=cmd_data_ctr)
    convert.add_commands(data)


def _check_data_flags(args) -> None:
    if not 0 < args.validation_fraction < 1:  # also refuses nan
        raise CLIError(f"--validation-fraction must be between 0 and 1 (exclusive), got {args.validation_fraction!r}")
    if getattr(args, "rows", 2) < 2:  # both splits need a record
        raise CLIError(f"--rows must be at least 2, got {args.rows}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise CLIError(f"--out {args.out} exists and is not a directory (the data set is written as "
                       f"{os.path.join(args.out, 'train')} and {os.path.join(args.out, 'validation')})")


def cmd_data_digits(args) -> int:
    _check_data_flags(args)
    if args.format == "example":  # tf.train.Example records, as ElasticDL modules parse them
        from flextrain.data.example import write_digits_examples as write_digits
    else:
        from flextrain.data.digits import write_digits

    info = write_digits(args.out, validation_fraction=args.validation_fraction, seed=args.seed)
    print(f"wrote {info['train']} training and {info['validation']} validation digits ({args.format}) to {args.out}")
    return 0


def cmd_data_ctr(args) -> int:
    _check_data_flags(args)
    from flextrain.data.ctr import write_ctr

    info = write_ctr(args.out, rows=args.rows, validation_fraction=args.validation_fraction, seed=args.seed)
    print(f"wrote {info['train']} training and {info['validation']} validation click records to {args.out} "
          f"(click rate {info['positive_rate']:.3f})")
    return 0
