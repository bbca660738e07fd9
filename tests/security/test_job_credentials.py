"""A job's TLS material and token (flextrain/protocol/security.py), on real gRPC servers on loopback: calls
with the job's token over TLS pass; without it, with another token, in plaintext, or trusting another job's
CA they are refused — by a sync server (the parameter servers') and an asyncio one (the master's)."""

from __future__ import annotations

import asyncio
import stat
import threading
from concurrent import futures

import grpc
import pytest

from flextrain.protocol.security import (AioTokenInterceptor, JobCredentials, TokenInterceptor, add_port,
                                         make_credentials, open_channel, read_credentials, write_credentials)

SERVICE = "test.Echo"


def _echo(request: bytes, context) -> bytes:
    return b"echo:" + request


def _count(requests, context) -> bytes:
    return str(sum(len(r) for r in requests)).encode()


async def _aio_echo(request: bytes, context) -> bytes:
    return b"echo:" + request


async def _aio_count(requests, context) -> bytes:
    return str(sum([len(r) async for r in requests])).encode()


def handlers(aio: bool = False):
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Echo": grpc.unary_unary_rpc_method_handler(_aio_echo if aio else _echo),
        "Count": grpc.stream_unary_rpc_method_handler(_aio_count if aio else _count),
    })


def calls(channel):
    echo = channel.unary_unary(f"/{SERVICE}/Echo")
    count = channel.stream_unary(f"/{SERVICE}/Count")
    return echo, count


@pytest.fixture(scope="module")
def job():
    return make_credentials("digits")


@pytest.fixture
def sync_server(job):
    refused = []
    server = grpc.server(futures.ThreadPoolExecutor(4),
                         interceptors=[TokenInterceptor(job.token, on_refused=refused.append)])
    server.add_generic_rpc_handlers((handlers(),))
    port = add_port(server, "127.0.0.1:0", job)
    server.start()
    yield f"127.0.0.1:{port}", refused
    server.stop(0)


@pytest.fixture
def aio_server(job):
    """The master's kind: grpc.aio on an event loop in a thread of its own (as master/servicer.py runs it)."""
    refused, loop = [], asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        server = grpc.aio.server(interceptors=[AioTokenInterceptor(job.token, on_refused=refused.append)])
        server.add_generic_rpc_handlers((handlers(aio=True),))
        port = add_port(server, "127.0.0.1:0", job)
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    yield f"127.0.0.1:{port}", refused
    asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.parametrize("which", ["sync_server", "aio_server"])
def test_the_jobs_token_over_tls_passes_and_anything_else_is_refused(which, job, request):
    address, refused = request.getfixturevalue(which)
    with open_channel(address, job) as channel:
        echo, count = calls(channel)
        assert echo(b"hi", timeout=10) == b"echo:hi"
        assert count(iter([b"ab", b"cde"]), timeout=10) == b"5"
    assert refused == []

    # Trusting the job's CA but sending no token:
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(job.ca),
                             options=[("grpc.ssl_target_name_override", "flextrain-job")]) as channel:
        for call, arg in zip(calls(channel), (b"hi", iter([b"x"]))):
            with pytest.raises(grpc.RpcError) as err:
                call(arg, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "token is required" in err.value.details()
    assert refused == [f"/{SERVICE}/Echo", f"/{SERVICE}/Count"]

    with open_channel(address, JobCredentials(token="guess", ca=job.ca)) as channel:
        with pytest.raises(grpc.RpcError) as err:
            calls(channel)[0](b"hi", timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and len(refused) == 3

    # Plaintext to a TLS server, and TLS trusting another job's CA: no connection at all.
    with open_channel(address, JobCredentials(token=job.token)) as channel:
        with pytest.raises(grpc.RpcError) as err:
            calls(channel)[0](b"hi", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    other = make_credentials("other")
    with open_channel(address, JobCredentials(token=job.token, ca=other.ca)) as channel:
        with pytest.raises(grpc.RpcError) as err:
            calls(channel)[0](b"hi", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(refused) == 3  # those never reached the server


def test_token_only_runs_in_plaintext_and_is_still_checked():
    creds = make_credentials("local", tls=False)
    assert not creds.tls and len(creds.token) >= 40
    refused = []
    server = grpc.server(futures.ThreadPoolExecutor(2),
                         interceptors=[TokenInterceptor(creds.token, on_refused=refused.append)])
    server.add_generic_rpc_handlers((handlers(),))
    address = f"127.0.0.1:{add_port(server, '127.0.0.1:0', creds)}"
    server.start()
    try:
        with open_channel(address, creds) as channel:
            assert calls(channel)[0](b"a", timeout=10) == b"echo:a"
        with open_channel(address, None) as channel:
            with pytest.raises(grpc.RpcError) as err:
                calls(channel)[0](b"a", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and len(refused) == 1
    finally:
        server.stop(0)


def test_the_files_round_trip_with_private_modes_and_a_broken_set_is_named(job, tmp_path):
    directory = tmp_path / "tls"
    write_credentials(directory, job)
    assert read_credentials(directory, server=True) == job
    assert read_credentials(directory) == JobCredentials(token=job.token, ca=job.ca)  # a client's part
    assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "tls.crt", "tls.key", "token"]
    for name, mode in (("tls.key", 0o600), ("token", 0o600), ("tls.crt", 0o644)):
        assert stat.S_IMODE((directory / name).stat().st_mode) == mode, name
    with pytest.raises(ValueError, match=r"none/token is missing"):  # read only for a job with TLS on
        read_credentials(tmp_path / "none")
    (directory / "tls.key").unlink()
    with pytest.raises(ValueError, match=r"tls.key is missing: a job with TLS on needs its private key"):
        read_credentials(directory, server=True)
    assert make_credentials("digits").token != job.token  # every job its own
