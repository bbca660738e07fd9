"""The committed protobuf/gRPC modules match proto/*.proto (regenerate with `make proto`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


from flextrain.proto import build
from flextrain.proto import flextrain_pb2 as pb

COMMITTED = Path(build.__file__).resolve().parent


def test_generated_modules_are_up_to_date(tmp_path):
    # protoc runs in a child process: in-process it can crash (SIGSEGV) once another
    # protobuf runtime (TensorFlow's, loaded by earlier tests) shares the process.
    subprocess.run([sys.executable, "-m", "flextrain.proto.build", str(tmp_path)], check=True,
                   cwd=build.REPO_ROOT, capture_output=True)
    generated = [tmp_path / "flextrain" / "proto" / name for name in build.GENERATED]
    assert sorted(p.name for p in generated) == sorted(build.GENERATED)
    for path in generated:
        committed = COMMITTED / path.name
        assert committed.is_file(), f"{committed} is not committed; run `make proto`"
        assert path.read_bytes() == committed.read_bytes(), (
            f"{committed.relative_to(build.REPO_ROOT)} is stale: it differs from what "
            f"proto/*.proto generates; run `make proto`"
        )


def test_generated_code_uses_package_absolute_imports():
    grpc_src = (COMMITTED / "flextrain_pb2_grpc.py").read_text()
    assert "from flextrain.proto import flextrain_pb2" in grpc_src
    assert not re.search(r"^import flextrain_pb2", grpc_src, re.M)


def test_tensor_message_has_dtype_shape_data():
    text = (build.PROTO_DIR / "flextrain.proto").read_text()
    match = re.search(r"message\s+Tensor\s*\{(.*?)\}", text, re.S)
    assert match, "proto/flextrain.proto defines no Tensor message"
    body = match.group(1)
    assert re.search(r"\bstring\s+dtype\s*=\s*\d+\s*;", body)
    assert re.search(r"\brepeated\s+int64\s+shape\s*=\s*\d+\s*;", body)
    assert re.search(r"\bbytes\s+data\s*=\s*\d+\s*;", body)

    fields = pb.Tensor.DESCRIPTOR.fields_by_name
    assert set(fields) >= {"dtype", "shape", "data"}
    assert fields["dtype"].type == fields["dtype"].TYPE_STRING
    assert fields["shape"].type == fields["shape"].TYPE_INT64
    assert fields["data"].type == fields["data"].TYPE_BYTES
    t = pb.Tensor(dtype="float32", shape=[2, 3], data=b"\x00" * 24)
    back = pb.Tensor.FromString(t.SerializeToString())
    assert (back.dtype, list(back.shape), len(back.data)) == ("float32", [2, 3], 24)
