"""PS process entry points: ``start_ps`` (in-process handle), ``run_ps`` (blocking), CLI.

``python -m flextrain.ps.main --shard-index 0 --num-ps 2 --port 0 --address-file ps0.addr ...``

Start-up order: build the shard, restore the newest checkpoint of this shard
index (if any), then listen; so a relaunched PS answers its first request with
the restored version. The bound address is logged, printed on stdout as
``flextrain-ps <index> listening on <host:port>`` and, with ``address_file``,
written atomically to that file (a launcher polls for it; port 0 picks a free
port). SIGTERM/SIGINT write a final checkpoint (when a checkpoint directory is
set) and stop the server.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch

from flextrain.ps.checkpoint import Checkpointer
from flextrain.ps.optimizers import make_optimizer
from flextrain.protocol.security import JobCredentials, from_environment
from flextrain.ps.server import PSServicer, start_server
from flextrain.ps.state import ShardState, SyncSettings

log = logging.getLogger("flextrain.ps")


@dataclass
class PSHandle:
    """A running PS in this process."""

    shard: ShardState
    server: grpc.Server
    port: int
    address: str
    checkpointer: Checkpointer | None

    def stop(self, grace: float = 1.0, *, checkpoint: bool = True) -> None:
        """Stop serving; first write a final checkpoint if a directory is configured."""
        if checkpoint and self.checkpointer is not None:
            try:
                self.checkpointer.save(self.shard)
            except OSError as exc:
                log.error("final PS checkpoint failed: %s", exc)
        self.server.stop(grace).wait()
        if self.shard.wal is not None:
            self.shard.wal.close()  # writes what is queued; a relaunch in this process may reopen the directory


def start_ps(*, port: int = 0, host: str = "0.0.0.0", advertise_host: str | None = None, shard_index: int = 0,
             num_ps: int = 1, checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0,
             keep_checkpoints: int = 2, optimizer: str | None = None, hyper: dict | None = None,
             mode: str = "sync", grads_to_wait: int = 1, version_tolerance: int = 0, staleness_lr: bool = False,
             max_staleness: int = 0, chunk_bytes: int = 1 << 20, threads: int = 32,
             torch_threads: int | None = None, wal: bool = True, wal_fsync: bool = False,
             creds: JobCredentials | None = None) -> PSHandle:
    """Build, restore and start a PS; returns at once. ValueError for bad settings (e.g. unknown optimizer).

    With a ``checkpoint_dir`` the shard is durable: checkpoints every ``checkpoint_every``
    versions plus a write-ahead log of every acknowledged change (``wal_fsync``: fsync each
    record, surviving the loss of the machine, not only of the process). ``wal=False``: no log
    (pushes cost no disk writes; a relaunched PS loses the updates since its last checkpoint).
    ``creds``: TLS and the job's token (flextrain/protocol/security.py); None: plaintext, no token.
    """
    if torch_threads:
        torch.set_num_threads(torch_threads)
    opt = make_optimizer(optimizer, hyper) if optimizer else None
    sync = SyncSettings(mode, grads_to_wait, version_tolerance, staleness_lr, max_staleness).validated()
    shard = ShardState(shard_index, num_ps, optimizer=opt, sync=sync)
    checkpointer = None
    if checkpoint_dir:
        checkpointer = Checkpointer(checkpoint_dir, shard_index, every=checkpoint_every, keep=keep_checkpoints,
                                    wal=wal, wal_fsync=wal_fsync)
        restored = checkpointer.restore(shard, keep_sync=sync)
        if restored is not None and opt is not None and shard.optimizer is not None \
                and (opt.name, opt.hyper) != (shard.optimizer.name, shard.optimizer.hyper):
            # Its slots were built for the checkpointed optimizer, so that one stays.
            log.warning("PS %d keeps the checkpointed optimizer %s (asked for %s)", shard_index,
                        shard.optimizer.describe(), opt.describe())
        checkpointer.attach(shard)
    servicer = PSServicer(shard, checkpointer=checkpointer, chunk_bytes=chunk_bytes,
                          max_waiters=max(1, threads // 2))
    server, bound = start_server(servicer, host=host, port=port, threads=threads, creds=creds)
    wildcard = host in ("", "0.0.0.0", "[::]", "::")
    address = f"{advertise_host or ('127.0.0.1' if wildcard else host)}:{bound}"
    log.info("PS %d/%d listening on %s (version %d, %s, optimizer %s)", shard_index, num_ps, address,
             shard.version, sync.mode, shard.optimizer.describe() if shard.optimizer else "not set")
    return PSHandle(shard, server, bound, address, checkpointer)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)  # a launcher never reads a half-written address


def run_ps(*, address_file: str | os.PathLike | None = None, **kwargs) -> int:
    """Run a PS until SIGTERM/SIGINT (see :func:`start_ps` for the settings); returns the bound port."""
    handle = start_ps(**kwargs)
    # Everything built so far (modules, torch, the restored state) lives as long as the process: out of
    # the collector's sight, full collections no longer walk it (8% of a PS's CPU during row pulls).
    gc.freeze()
    print(f"flextrain-ps {handle.shard.shard_index} listening on {handle.address}", flush=True)
    if address_file:
        _write_atomic(Path(address_file), handle.address + "\n")
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    log.info("PS %d stopping at version %d", handle.shard.shard_index, handle.shard.version)
    handle.stop()
    return handle.port


def _hyper_arg(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return key.strip(), float(value)  # float(), never eval: this may come from a job spec
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hyper wants NAME=NUMBER, got {text!r}") from None


def make_parser() -> argparse.ArgumentParser:
    """The PS process's command line (what the master's ``flextrain ps ...`` arguments are parsed by)."""
    p = argparse.ArgumentParser(prog="python -m flextrain.ps.main", description="Run one parameter-server shard.")
    p.add_argument("--shard-index", type=int, required=True)
    p.add_argument("--num-ps", type=int, required=True)
    p.add_argument("--port", type=int, default=0, help="0: any free port (see --address-file)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--advertise-host", default=None, help="host written to --address-file (default 127.0.0.1)")
    p.add_argument("--address-file", default=None, help="write host:port here once listening")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every K versions (0: never)")
    p.add_argument("--no-wal", dest="wal", action="store_false",
                   help="no write-ahead log: a relaunched PS loses the updates since its last checkpoint")
    p.add_argument("--wal-fsync", action="store_true",
                   help="fdatasync the write-ahead log before answering (one flush per group of pushes; "
                        "survives machine loss)")
    p.add_argument("--optimizer", default=None, help="sgd, momentum, adam, adamw, adagrad (or set by a worker)")
    p.add_argument("--hyper", type=_hyper_arg, action="append", default=[], help="NAME=NUMBER, repeatable")
    p.add_argument("--mode", choices=("sync", "async"), default="sync")
    p.add_argument("--grads-to-wait", type=int, default=1)
    p.add_argument("--version-tolerance", type=int, default=0)
    p.add_argument("--staleness-lr", action="store_true")
    p.add_argument("--max-staleness", type=int, default=0)
    p.add_argument("--chunk-bytes", type=int, default=1 << 20)
    p.add_argument("--threads", type=int, default=32, help="gRPC handler threads")
    p.add_argument("--torch-threads", type=int, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s ps %(levelname)s %(message)s", stream=sys.stderr)
    try:
        run_ps(port=args.port, host=args.host, advertise_host=args.advertise_host, address_file=args.address_file,
               shard_index=args.shard_index, num_ps=args.num_ps, checkpoint_dir=args.checkpoint_dir,
               checkpoint_every=args.checkpoint_every, optimizer=args.optimizer, hyper=dict(args.hyper),
               mode=args.mode, grads_to_wait=args.grads_to_wait, version_tolerance=args.version_tolerance,
               staleness_lr=args.staleness_lr, max_staleness=args.max_staleness, chunk_bytes=args.chunk_bytes,
               threads=args.threads, torch_threads=args.torch_threads, wal=args.wal,
               wal_fsync=args.wal_fsync, creds=from_environment(server=True))  # --tls: the job's material, from its master
    except (ValueError, OSError) as exc:
        print(f"flextrain-ps: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
