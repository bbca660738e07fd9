"""A --tls job's master prints no gRPC core line for a plaintext client's failed handshake (the core's
INFO ``Handshake failed ... WRONG_VERSION_NUMBER``), and does not hand its quieting down to the processes it
starts. A fresh interpreter, as ``flextrain train`` is: GRPC_VERBOSITY counts only before grpc's import."""

from __future__ import annotations

import os
import subprocess
import sys

from ft_helpers import REPO

SERVE_AND_DIAL = """
import os, subprocess, sys
from concurrent import futures
import flextrain.cli  # what `flextrain train` imports before it runs the master
import grpc
from flextrain.protocol.security import add_port, make_credentials

server = grpc.server(futures.ThreadPoolExecutor(2))
port = add_port(server, "127.0.0.1:0", make_credentials("job"))
server.start()
with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # plaintext at a TLS port: the handshake fails
    try:
        channel.unary_unary("/x.Y/Z")(b"", timeout=5)
    except grpc.RpcError as exc:
        print("client:", exc.code().name)
server.stop(0)
print("child:", subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('GRPC_VERBOSITY'))"],
                               capture_output=True, text=True).stdout.strip())
"""


def _run(env):
    return subprocess.run([sys.executable, "-c", SERVE_AND_DIAL], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=env)


def test_the_masters_process_prints_no_grpc_core_line_for_a_plaintext_client():
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = _run(env)
    assert done.returncode == 0, done.stderr
    assert "client: UNAVAILABLE" in done.stdout and "child: None" in done.stdout, done.stdout
    assert "Handshake failed" not in done.stderr, done.stderr


def test_a_grpc_verbosity_of_the_users_own_stands():
    done = _run({**os.environ, "GRPC_VERBOSITY": "INFO"})
    assert done.returncode == 0, done.stderr
    assert "Handshake failed" in done.stderr and "child: INFO" in done.stdout
