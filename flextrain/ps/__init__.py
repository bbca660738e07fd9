"""Parameter server: dense shards, embedding tables, optimizers, checkpoints.

Start one with :func:`flextrain.ps.main.run_ps` (or ``python -m flextrain.ps.main``).
Workers reach it only over gRPC (``proto/ps.proto``) through
``flextrain.worker.ps_client.PSClient``. The modules a worker may import from
here are the protocol ones, shared by both ends and holding no server state:
:mod:`~flextrain.protocol.shard` (routing), :mod:`~flextrain.protocol.wire` (hot-path
byte codec) and :mod:`~flextrain.protocol.codec` (tensors <-> messages). Everything
else is PS internals. Keep this ``__init__`` free of imports.
"""
