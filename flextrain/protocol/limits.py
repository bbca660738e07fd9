"""Bounds on what travels over the wire: one place for every server and channel.

Each gRPC server (master, PS) and each channel to one (worker -> master,
worker -> PS, CLI -> master, operator -> master, master -> PS) sets its
message size limits from here, explicitly, in both directions: a message
above the limit is refused by gRPC itself (RESOURCE_EXHAUSTED) before any
handler sees it. The per-field bounds below are checked by the receivers
(flextrain/ps/server.py, flextrain/master/wire_checks.py) before the values
are used, so a hostile or malformed message is refused with INVALID_ARGUMENT
naming the field and the bound, and never allocates more than it carried.
"""

from __future__ import annotations

# ---- PS streams ---------------------------------------------------------------
# Bulk transfers are cut into chunks of MIN_CHUNK..MAX_CHUNK bytes of tensor data.
MIN_CHUNK, MAX_CHUNK = 4 << 10, 3 << 20
# The largest PS message is a sparse push block: MAX_CHUNK bytes of float16 rows of width 1
# carry 4x as many bytes of int64 ids (5 * MAX_CHUNK = 15 MiB), plus small headers.
MAX_PS_MESSAGE = 16 << 20
# A row of an embedding table travels whole in one message: its bytes must fit a chunk.
MAX_ROW_BYTES = MAX_CHUNK
# One TaskProgress asks about the tasks of a worker's current round: a few, never this many.
MAX_TASK_IDS = 1 << 16

# ---- master -------------------------------------------------------------------
# Master messages are small (ids, positions, counters) except a few JSON texts: the JobSpec and
# status.json (kilobytes), and the ledger of a flash snapshot in ReportCheckpoint, which grows with
# the number of tasks a job has open (a few hundred bytes each).
MAX_MASTER_MESSAGE = 16 << 20
MAX_ID_CHARS = 253        # worker ids, metric and failure kinds: a Kubernetes object name at most
MAX_TEXT_CHARS = 64 << 10  # errors, tracebacks, reasons, strategy JSON
MAX_AHEAD_COUNT = 1024    # tasks one GetTask may take ahead (workers ask for at most 32)
MAX_WORKERS = 100_000     # Scale's target and the like: beyond any real job
MAX_METRIC_VALUES = 1 << 20  # doubles in one mergeable metric's state (e.g. AUC histogram buckets)


def message_options(limit: int) -> list[tuple[str, int]]:
    """gRPC options setting both message size limits to ``limit`` bytes."""
    return [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]


PS_MESSAGE_OPTIONS = message_options(MAX_PS_MESSAGE)
MASTER_MESSAGE_OPTIONS = message_options(MAX_MASTER_MESSAGE)
