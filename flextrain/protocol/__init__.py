"""What a worker and a parameter server share besides the generated messages (``flextrain.proto``).

* :mod:`~flextrain.protocol.shard`: which PS owns a dense parameter or an embedding row;
* :mod:`~flextrain.protocol.wire`: the hot-path byte framing of tensors in messages;
* :mod:`~flextrain.protocol.codec`: tensors and optimizer settings <-> messages.

Both ends import these and nothing of each other (import-linter forbids ``worker -> ps``).
Nothing here holds state. Keep this ``__init__`` free of imports.
"""
