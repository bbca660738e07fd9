"""PS fault tolerance with real processes: SIGKILL, relaunch, restore, reconnect; unreachable PS."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest
import torch

from flextrain.worker.ps_client import PSClient, PSUnavailable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_killed_ps_restores_checkpoint_plus_log_and_the_client_carries_on(tmp_path, spawn_ps):
    """SIGKILL after version 5, last checkpoint at 4: the write-ahead log brings back update 5."""
    ckpt = tmp_path / "ckpt"
    port = _free_port()
    args = ["--shard-index", "0", "--num-ps", "1", "--port", str(port), "--optimizer", "momentum",
            "--hyper", "lr=0.1", "--mode", "async", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
    proc, address = spawn_ps(*args)
    client = PSClient([address], give_up=30, deadline=5)
    w0 = torch.arange(6, dtype=torch.float32)
    client.init_dense({"w": w0})
    client.declare_table("e", 3, seed=5)
    rows0 = client.pull_embedding("e", [7, 8])
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(6, generator=gen) for _ in range(6)]
    row_grads = [torch.randn(1, 3, generator=gen) for _ in range(6)]
    for k in range(5):  # versions 1..5; checkpoints at 2 and 4
        client.pull_dense(client.version)
        assert client.push({"w": grads[k]}, {"e": ([7], row_grads[k])}).accepted
    shard_dir = ckpt / "ps-0"
    deadline = time.monotonic() + 10
    while not (shard_dir / "version-4.ckpt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    incarnation = client.describe()[0].incarnation

    proc.send_signal(signal.SIGKILL)  # no chance to write a final checkpoint
    proc.wait(10)
    # checkpoints 2 and 4; the log segment being written (all records fit in it) and at most 2 allocated ahead
    names = sorted(p.name for p in shard_dir.iterdir())
    assert names[:3] == ["version-2.ckpt", "version-4.ckpt", "wal-0.log"]
    assert set(names[3:]) <= {"wal-1.log", "wal-2.log"}

    # The next push starts while the PS is down; its retries bridge the relaunch.
    result = {}
    pusher = threading.Thread(target=lambda: result.update(r=client.push({"w": grads[5]}, {"e": ([7], row_grads[5])})))
    pusher.start()
    time.sleep(0.5)
    proc2, address2 = spawn_ps(*args, name="ps-again")
    assert address2 == address
    pusher.join(30)
    assert result["r"].accepted and result["r"].version == 6  # restored at 4, replayed 5, then this push

    info = client.describe()[0]
    assert info.incarnation != incarnation and info.version == 6
    version, params = client.pull_dense(client.version)  # the restart is noticed: a full pull
    assert version == 6 and params is not None
    # Reference: momentum SGD over every gradient pushed (none lost with the kill).
    p = torch.nn.Parameter(w0.clone())
    r = torch.nn.Parameter(rows0[0:1].clone())
    opt = torch.optim.SGD([p, r], lr=0.1, momentum=0.9)
    for k in range(6):
        p.grad, r.grad = grads[k].clone(), row_grads[k].clone()
        opt.step()
    torch.testing.assert_close(params["w"], p.detach())
    rows = client.pull_embedding("e", [7, 8])
    torch.testing.assert_close(rows[0:1], r.detach())
    assert torch.equal(rows[1], rows0[1])  # never pushed: still its initial value

    proc2.send_signal(signal.SIGTERM)  # graceful stop: a final checkpoint
    assert proc2.wait(20) == 0
    assert (shard_dir / "version-6.ckpt").exists()
    assert not [p for p in shard_dir.iterdir() if p.name.startswith(".")]
    client.close()


def test_unreachable_ps_gives_up_with_its_address():
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    client = PSClient([address], give_up=0.6, deadline=0.5)
    started = time.monotonic()
    with pytest.raises(PSUnavailable) as err:
        client.init_dense({"w": torch.zeros(1)})
    elapsed = time.monotonic() - started
    assert address in str(err.value) and "did not answer" in str(err.value)
    assert 0.3 <= elapsed < 5  # retried with backoff until give_up, then stopped
    with pytest.raises(PSUnavailable, match=address):
        client.describe()
    client.close()


def test_cli_rejects_an_unknown_optimizer_and_bad_hyperparameters(capsys):
    from flextrain.ps.main import main

    assert main(["--shard-index", "0", "--num-ps", "1", "--port", "0", "--optimizer", "adamax"]) == 2
    err = capsys.readouterr().err
    assert "unknown optimizer 'adamax'" in err and "adagrad, adam, adamw, momentum, sgd" in err
    with pytest.raises(SystemExit):
        main(["--shard-index", "0", "--num-ps", "1", "--hyper", "lr=__import__('os')"])
    assert "--hyper wants NAME=NUMBER" in capsys.readouterr().err
