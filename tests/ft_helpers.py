"""Helpers shared by the test areas: paths, a runner for the real CLI, polling."""

from __future__ import annotations

from collections import Counter

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from flextrain.master.launcher import LaunchBackend

REPO = Path(__file__).resolve().parents[1]
MODEL_ZOO = REPO / "model_zoo"
DIGITS_MODEL = f"{MODEL_ZOO / 'digits_torch.py'}:Model"


def flextrain_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "flextrain", *args]


def run_flextrain(*args: str, timeout: float = 240, cwd: Path | None = None,
                  env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a child process (which launches real worker processes)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.run(flextrain_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


def without_feed_delay(env: dict[str, str]) -> dict[str, str]:
    """``env`` less the counting models' FT_FEED_DELAY: for the run of a job (a resume) that need not
    outlast a test's events, at full speed."""
    return {k: v for k, v in env.items() if k != "FT_FEED_DELAY"}


def read_status(job_dir: Path) -> dict:
    return json.loads((job_dir / "status.json").read_text())


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now (for a server a test starts next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(tmp_path: Path, script: str, *args: str, timeout: float = 240) -> list[dict]:
    """Run ``script`` (a path below tests/) as two real gloo ranks (WORLD_SIZE/RANK/MASTER_ADDR/MASTER_PORT,
    as torchrun sets them; its directory on their PYTHONPATH) and read the JSON each writes to the file
    named by its first argument."""
    path = REPO / "tests" / script
    base = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join([str(path.parent), *(p for p in sys.path if p)]))
    procs = [subprocess.Popen([sys.executable, str(path), str(tmp_path / f"rank{r}.json"), *args],
                              env={**base, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{out[-6000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def finish(proc, timeout=300):
    """Wait for a job's CLI process to exit (killed past ``timeout`` or on an error): ``(exit code, stderr)``."""
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, err


def command_line(pid: int | str) -> list[str]:
    """Process ``pid``'s arguments; OSError once it is gone. A process forked from the zygote
    (flextrain/zygote.py) shows its command line as one title, split here at its spaces."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    return argv[0].split(" ") if len(argv) == 1 else argv


def processes_with_args(*args: str) -> list[int]:
    """Pids of live processes whose command line holds ``args`` in a row (e.g. a job's workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = command_line(proc.name)
        except OSError:  # gone meanwhile
            continue
        if any(argv[i:i + len(args)] == list(args) for i in range(len(argv))):
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts: its parent has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(predicate, *, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns a truthy value (observing another process's state)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


COUNTING_MODEL = f"{Path(__file__).resolve().parent / 'e2e' / 'zoo' / 'counting_digits.py'}:Model"


def counting_data(digits_dir: Path, out: Path, *, records: int = 1408) -> Path:
    """One training file of the first ``records`` digits (a multiple of the global batch)."""
    from flextrain.data import read_records, write_records

    out.mkdir(parents=True, exist_ok=True)
    source = sorted((digits_dir / "train").glob("*.rio"))[0]
    write_records(out / "part-0.rio", read_records(source)[:records], max_chunk_size=64 * 1024)
    return out


def seen_counts(job_dir: Path, name: str = "final.ckpt"):
    """The per-record application counts held in a checkpoint of the counting model."""
    from flextrain.elastic.statecodec import decode

    state = decode((job_dir / "checkpoints" / name).read_bytes())
    return state["model"]["seen"], state["version"]


def applied_at_checkpoint(job_dir):
    """Per-record counts of the latest checkpoint and the records its ledger still owes."""
    meta = json.loads((job_dir / "checkpoints" / "latest.json").read_text())
    seen, version = seen_counts(job_dir, os.path.basename(meta["checkpoint"]))
    ledger = json.loads((job_dir / "checkpoints" / meta["ledger"]).read_text())
    return seen, version, ledger


def assert_exactly_once_at_latest_checkpoint(job_dir, *, G: int = 32, records: int = 1408):
    """The counting model (tests/e2e/zoo/counting_digits.py) of a stopped job saw `version` full steps of
    G records, and every record was applied exactly as often as the epochs cut so far (the ledger's
    `epoch` + 1) minus the times the ledger saved with that checkpoint still owes it (its TODO tasks,
    of any epoch: the next epoch is cut as soon as nothing of the current one is TODO, so both may be
    owed at once)."""
    seen, version, ledger = applied_at_checkpoint(job_dir)
    assert int(seen.sum().item()) == version * G
    assert ledger["records_done"] == version * G
    owed = Counter(i for t in ledger["todo"] for i in range(t["start"], t["end"]))
    assert max(owed, default=0) < records
    cut = ledger["epoch"] + 1
    counts = seen.tolist()
    assert len(counts) == records
    wrong = {i: (c, owed[i]) for i, c in enumerate(counts) if c + owed[i] != cut}
    assert not wrong, f"records applied (count, owed) != {cut} epochs cut: {dict(list(wrong.items())[:10])}"
    return seen, version


class FakeBackend(LaunchBackend):
    """A launch backend that only records: launches (``specs``, ``live``), terminations, promotions; the
    test injects exits with :meth:`exit`. For the instance manager's logic, when no process is under test."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: dict[str, object] = {}
        self.live: set[str] = set()
        self.terminated: list[str] = []
        self.promoted: list[str] = []

    def launch(self, spec) -> None:
        self.specs[spec.instance_id] = spec
        self.live.add(spec.instance_id)

    def promote(self, instance_id: str) -> None:
        self.promoted.append(instance_id)

    def terminate(self, instance_id: str, *, force: bool = False) -> None:
        self.terminated.append(instance_id)

    def running(self) -> set[str]:
        return set(self.live)

    def close(self, *, grace: float = 5.0) -> None:
        pass

    def exit(self, instance_id: str, code: int) -> None:
        self.live.discard(instance_id)
        self._on_exit(instance_id, code)


class FakeMaster:
    """A master client that hands out the given tasks, then NO_MORE, and records reports:
    for driving a trainer in process when the master is not under test."""

    worker_id = "worker-0"
    creds = None  # no --tls: the trainer dials its parameter servers in plaintext

    def __init__(self, tasks):
        self.tasks, self.reports = list(tasks), []

    def get_task(self, **kw):
        from flextrain.proto import flextrain_pb2 as pb

        if self.tasks:
            return pb.GetTaskResponse(action=pb.GetTaskResponse.RUN, task=self.tasks.pop(0))
        return pb.GetTaskResponse(action=pb.GetTaskResponse.NO_MORE)

    def get_task_ahead(self, **kw):
        """No early answers: the trainer falls back to ``get_task``."""
        from concurrent.futures import Future

        from flextrain.proto import flextrain_pb2 as pb

        answer = Future()
        answer.set_result(pb.GetTaskResponse(action=pb.GetTaskResponse.WAIT))
        return answer

    def report_task(self, task_id, **kw):
        self.reports.append((task_id, kw))


def ps_counts(job_dir: Path, records: int, num_ps: int = 2):
    """(dense counts, row counts) per record of the PS counting model (tests/e2e/zoo/counting_ps.py),
    from the PS's checkpoints and write-ahead logs, in the dtype the PS holds them in."""
    import numpy as np
    import torch

    from flextrain.ps.checkpoint import Checkpointer
    from flextrain.protocol.shard import row_owners
    from flextrain.ps.state import ShardState

    dense, rows = None, None
    ids = np.arange(records)
    owners = row_owners(ids, num_ps)
    for i in range(num_ps):
        shard = ShardState(i, num_ps)
        assert Checkpointer(job_dir / "ps-checkpoints", i).restore(shard) is not None
        if shard.dense is not None and "seen" in shard.dense.params.views:
            dense = shard.dense.params.views["seen"].clone()
        table = shard.tables["seen_rows"]
        rows = torch.zeros(records, dtype=table.dtype) if rows is None else rows
        mine = ids[owners == i]
        rows[mine] = table.gather(mine)[:, 0]
    return dense, rows


def counted_exactly_once_through_a_kill(model: str, data: str, job_dir: Path, *, epochs: int, records: int = 1408,
                                        G: int = 32, victim_rank: int = 1) -> dict:
    """Train the counting model (or a module re-exporting it) on ``data`` with 3 workers, SIGKILL the one
    of ``victim_rank`` once all three train, and check the job goes on without it, succeeds, and applied
    every record exactly ``epochs`` times (the data sources' exactly-once tests share this). Returns the
    final status. A stand-in compute (FT_FEED_DELAY, 0.05 s a feed) keeps the job from ending before the
    survivors re-form; it is lifted then (FT_FEED_DELAY_UNTIL): the rest trains at full speed."""
    import signal

    def status_of():
        return read_status(job_dir) if (job_dir / "status.json").exists() else None

    def last_round():
        s = status_of()
        return s["roundHistory"][-1] if s and s["roundHistory"] and s["phase"] == "Running" else None

    def without(victim, after, s):
        return any(r["round"] > after and victim not in {m["id"] for m in r["members"]} for r in s["roundHistory"])

    cmd = flextrain_cmd("train", "--model-def", model, "--training-data", data, "--global-batch-size", str(G),
                        "--max-micro-batch", "8", "--lr", "0.05", "--job-dir", str(job_dir), "--workers", "3",
                        "--min-workers", "1", "--max-workers", "3", "--epochs", str(epochs))
    calm = job_dir.with_name(f"{job_dir.name}.calm")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FT_COUNT_G": str(G), "FT_COUNT_RECORDS": str(records),
                                 "FT_FEED_DELAY": "0.05", "FT_FEED_DELAY_UNTIL": str(calm)})
    try:
        first = wait_for(lambda: (r := last_round()) and len(r["members"]) == 3 and
                         status_of()["step"] > r["version"] + 10 and r, timeout=120, what="3 workers training")
        victim = first["members"][victim_rank]["id"]
        os.kill(first["members"][victim_rank]["pid"], signal.SIGKILL)
        wait_for(lambda: (s := status_of()) and (s["phase"] != "Running" or without(victim, first["round"], s)),
                 timeout=60, what="a round without the killed worker")
        calm.touch()
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    final = read_status(job_dir)
    assert without(victim, first["round"], final), final["roundHistory"]
    seen, version = seen_counts(job_dir)
    assert version == epochs * records // G
    assert seen.min().item() == seen.max().item() == epochs
    return final


def member_checksums(where: Path) -> dict[int, dict[str, tuple[str, float]]]:
    """What the counting model's ``FT_CHECKSUM_DIR`` holds: ``{samples applied: {worker: (digest, time)}}``."""
    by_step: dict[int, dict[str, tuple[str, float]]] = {}
    for f in Path(where).glob("*.txt"):
        for line in f.read_text().splitlines():
            applied, digest, at = line.split()
            by_step.setdefault(int(applied), {})[f.stem] = (digest, float(at))
    return by_step


def assert_members_identical(by_step: dict, *, killed=()) -> None:
    """Every worker that committed a step holds the same parameters and momentum after it.

    A worker in ``killed`` (SIGKILLed inside a collective) may have finished its last all-reduce and
    applied the step while its peers' all-reduce failed for want of its last bytes: that step was never
    the round's (the survivors redo it), so the killed worker's last one is left out."""
    for worker in killed:
        last = max((step for step, members in by_step.items() if worker in members), default=None)
        if last is not None:
            by_step = {**by_step, last: {w: v for w, v in by_step[last].items() if w != worker}}
    split = sorted(step for step, members in by_step.items() if len({d for d, _ in members.values()}) > 1)
    assert not split, f"members' states differ after the steps that applied {split[:5]} samples"


def steps_shared_by(by_step: dict, workers) -> int:
    """How many steps every one of ``workers`` committed (their states compared there)."""
    return sum(1 for members in by_step.values() if set(workers) <= members.keys())


def last_step_before(by_step: dict, worker: str, t: float) -> int | None:
    """Samples applied by ``worker``'s model as of time ``t`` (its last committed step before)."""
    return max((step for step, members in by_step.items() if worker in members and members[worker][1] < t),
               default=None)


def round_started_in_sync(job_dir: Path, worker_id: str, round_id: int) -> bool | None:
    """Whether ``worker_id``'s log says round ``round_id`` started without a state broadcast
    (None: the log has no such round line)."""
    for line in (Path(job_dir) / "logs" / f"{worker_id}.log").read_text().splitlines():
        if f"round {round_id}: rank " in line:
            return "members in sync: no state broadcast" in line
    return None


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of the Prometheus exposition at ``url``, parsed with prometheus_client's own parser:
    (name, sorted labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
