"""flextrain data layer: RecordIO/CSV/Parquet readers, data sources and demo data.

Foundation layer: imports nothing from the rest of flextrain.
"""

from flextrain.data.batch import RecordBatch, records_array
from flextrain.data.chunkcache import RecordCacheStats, configure_record_cache, record_cache
from flextrain.data.csv import CSVReader
from flextrain.data.custom import CustomReaderError, CustomSource, ReaderTask, custom_source, plan_shards
from flextrain.data.digits import DIGITS_RECORD_BYTES, decode_digits, encode_digits, write_digits
from flextrain.data.errors import CorruptRecordIOError, DataError
from flextrain.data.parquet import ParquetReader
from flextrain.data.recordio import (
    DEFAULT_MAX_CHUNK_SIZE,
    ChunkInfo,
    Compressor,
    RecordIOReader,
    RecordIOWriter,
    read_records,
    write_records,
)
from flextrain.data.sources import (
    PARQUET_SHARD_ROWS,
    SUPPORTED_EXTENSIONS,
    DataOptions,
    Shard,
    clear_reader_cache,
    list_data_files,
    make_shards,
    open_reader,
    read_shard_range,
    shard_reader,
)

__all__ = [
    "RecordCacheStats",
    "configure_record_cache",
    "record_cache",
    "DataError",
    "CustomReaderError",
    "CustomSource",
    "ReaderTask",
    "custom_source",
    "plan_shards",
    "CorruptRecordIOError",
    "Compressor",
    "ChunkInfo",
    "DEFAULT_MAX_CHUNK_SIZE",
    "RecordIOWriter",
    "RecordIOReader",
    "write_records",
    "read_records",
    "CSVReader",
    "ParquetReader",
    "PARQUET_SHARD_ROWS",
    "SUPPORTED_EXTENSIONS",
    "DataOptions",
    "Shard",
    "open_reader",
    "list_data_files",
    "make_shards",
    "read_shard_range",
    "shard_reader",
    "RecordBatch",
    "records_array",
    "clear_reader_cache",
    "DIGITS_RECORD_BYTES",
    "write_digits",
    "decode_digits",
    "encode_digits",
]
