"""Parameter server: dense shards, embedding tables, optimizers, checkpoints.

Start one with :func:`flextrain.ps.main.run_ps` (or ``python -m flextrain.ps.main``).
Workers reach it only over gRPC (``proto/ps.proto``) through
``flextrain.worker.ps_client.PSClient``. The one module a worker may import from
here is :mod:`flextrain.ps.shard`: the routing rule is part of the wire contract
and has no dependencies. Keep this ``__init__`` free of imports so that import
stays light.
"""
