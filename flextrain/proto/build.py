"""Regenerate the protobuf/gRPC modules from ``proto/*.proto``.

``make proto`` runs this; ``tests/proto/test_generated.py`` runs it into a
temporary directory and fails if the committed modules differ (stale code).
The ``-I flextrain/proto=proto`` mapping makes grpc_tools emit package-absolute
imports (``from flextrain.proto import flextrain_pb2``), so no post-editing of
generated files is needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO_ROOT / "proto"
GENERATED = (
    "example_pb2.py", "example_pb2.pyi", "example_pb2_grpc.py",
    "flextrain_pb2.py", "flextrain_pb2.pyi", "flextrain_pb2_grpc.py",
    "ps_pb2.py", "ps_pb2.pyi", "ps_pb2_grpc.py",
)


def generate(out_root: Path) -> list[Path]:
    """Write the generated modules under ``out_root/flextrain/proto/``."""
    from grpc_tools import protoc  # build-time dependency only

    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise FileNotFoundError(f"no .proto files under {PROTO_DIR}")
    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-Iflextrain/proto={PROTO_DIR}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(str(p) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return [out_root / "flextrain" / "proto" / name for name in GENERATED]


if __name__ == "__main__":
    # `python -m flextrain.proto.build [OUT_ROOT]` (default: the repository itself).
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT
    for path in generate(out):
        print(path)
    sys.exit(0)
