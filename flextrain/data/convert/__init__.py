"""``flextrain data convert`` and ``flextrain data inspect``: other formats to RecordIO shards, and back.

* :mod:`~flextrain.data.convert.sources` -- what a source is (by extension or content) and :func:`open_source`
* :mod:`~flextrain.data.convert.tabular` -- CSV, JSON lines, ``.npy``/``.npz``, Parquet
* :mod:`~flextrain.data.convert.csvsplit` -- a CSV file cut into shard byte ranges that workers parse
* :mod:`~flextrain.data.convert.images` -- image folders (torchvision's ImageFolder layout)
* :mod:`~flextrain.data.convert.writer` -- :func:`convert`: shards ``data-00000``, ... written by a pool
* :mod:`~flextrain.data.convert.inspect` -- :func:`inspect_dir`: schema, counts, first records

The record encoding and the schema are :mod:`flextrain.data.rows`.
"""

from flextrain.data.convert.inspect import inspect_dir
from flextrain.data.convert.sources import KINDS, Source, open_source
from flextrain.data.convert.writer import ConvertOptions, ConvertResult, convert

__all__ = ["KINDS", "Source", "open_source", "ConvertOptions", "ConvertResult", "convert", "inspect_dir"]
