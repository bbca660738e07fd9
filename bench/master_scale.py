"""The master at scale: the real master against 1,000 simulated workers.

Prints one JSON object (progress goes to stderr). Method (bench/README.md, "master_scale.py"):

* **master**: a subprocess running :func:`flextrain.master.main.run_master` (what ``flextrain train``
  runs) on a real AllReduce JobSpec over the digits demo data, written to a temp dir, with its real
  ledger, rendezvous, gRPC server, status writer and instance manager. Only the launch backend is a
  stand-in (:class:`SimBackend`): it starts no process; the bench tells it on the master's stdin when a
  worker "exits", and it reports the exit (code 137, SIGKILL) through the same callback a real backend
  uses.
* **workers**: ``--procs`` processes, each driving its share of ``--workers`` clients with grpc.aio, one
  channel (TCP connection) per client. A client does what a real AllReduce worker does, without
  training: GetJobSpec, RegisterWorker, JoinRendezvous (long poll) until TRAIN; then per task of
  ``--task-seconds``: rank 0 of the round asks GetTask for the next task ahead during the task's last
  step (count 1, as a worker whose task takes about round_tasks.AHEAD_SECONDS), and plainly at the task
  boundary when the ahead answer was not a RUN; the other members get each answer from rank 0 at the
  boundary (flextrain/worker/round_tasks.py broadcasts it over the round's gloo group; here rank 0's
  process sends it to every simulating process in a UDP datagram on loopback: ``handoff_ms`` is how long
  a member waited for it at the boundary); a Heartbeat every ``heartbeat_interval`` the master gives in
  GetJobSpec, with the worker's position, at a random phase. ``--report-tasks``: every member also
  reports each finished task (ReportTask ok: ParameterServer and evaluation workers do; AllReduce
  workers report only failed tasks). ``--task-asks every``: the workers before rank 0 asked for the
  round: every member asks for every task (a burst of one call per member) and reports it, which is
  what this bench simulated until then.
* **leave**: after the steady window, ``--leave-fraction`` of the clients stop at once (as SIGKILLed
  processes would); the master is told they exited (``t0``, right after), and every survivor learns at
  ``t0`` that its collective failed and re-joins with reason ``collective_failed``, as a worker whose
  gloo peer died does. ``formation_s``: from ``t0`` to the moment each survivor holds the TRAIN answer
  of the new round (``last``: the slowest survivor, what the < 1 s target applies to).

Latencies are measured by the clients around each awaited call (client-side: they include the
client process's event-loop lag on this shared 2-core machine, ``client_loop_lag_ms``, so they are
upper bounds of the master's own); ``master_handler_ms`` times the master's servicer methods inside
the master (its own handling: no transport, no queueing). ``master_cpu``: user + system CPU seconds of the master process over the steady window
(/proc/PID/stat), per worker per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMOKE = {"workers": 50, "procs": 2, "steady": 4.0, "task_seconds": 1.0}
FULL = {"workers": 1000, "procs": 4, "steady": 20.0, "task_seconds": 2.0}
STEP_SECONDS = 0.1  # the simulated last step of a task: the ahead ask is sent this long before its end
TARGET_P99_MS = 10.0
TARGET_FORMATION_S = 1.0


def log(msg: str) -> None:
    print(f"[master_scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    v = sorted(values)

    def at(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))], 3)

    return {"n": len(v), "p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": round(v[-1], 3)}


# ---------------------------------------------------------------------------------------------------------
# master role
# ---------------------------------------------------------------------------------------------------------
def run_master_role(args) -> int:
    from rich.console import Console

    from flextrain.job import JobSpec
    from flextrain.master.launcher import LaunchBackend
    from flextrain.master.main import run_master

    class SimBackend(LaunchBackend):
        """Starts nothing; an exit is reported when the bench says so (stdin: ``exit ID ...``)."""

        def __init__(self) -> None:
            super().__init__()
            self._running: set[str] = set()
            self._lock = threading.Lock()
            self._announced = False

        def launch(self, spec) -> None:
            with self._lock:
                self._running.add(spec.instance_id)
                if not self._announced and "--master" in spec.args:
                    self._announced = True
                    print(f"ADDRESS {spec.args[spec.args.index('--master') + 1]}", flush=True)

        def terminate(self, instance_id: str, *, force: bool = False) -> None:
            self.exited(instance_id, 137)

        def running(self) -> set[str]:
            with self._lock:
                return set(self._running)

        def close(self, *, grace: float = 5.0) -> None:
            pass

        def exited(self, instance_id: str, code: int) -> None:
            with self._lock:
                if instance_id not in self._running:
                    return
                self._running.discard(instance_id)
            self._on_exit(instance_id, code)

    backend = SimBackend()
    handler_ms = time_handlers()
    if args.heartbeats_per_second:  # what the heartbeat budget buys: the same run with another budget
        import flextrain.master.main as master_main

        master_main.HEARTBEATS_PER_SECOND = args.heartbeats_per_second

    def control() -> None:
        for line in sys.stdin:
            words = line.split()
            if words and words[0] == "exit":
                for wid in words[1:]:
                    backend.exited(wid, 137)
                print(f"EXITED {time.monotonic():.6f}", flush=True)
            elif words and words[0] == "mark":
                for v in handler_ms.values():
                    v.clear()
            elif words and words[0] in ("prof_on", "prof_off"):
                PROFILING[0] = words[0] == "prof_on"
            elif words and words[0] == "handlers":
                print("HANDLERS " + json.dumps(handler_ms), flush=True)

    threading.Thread(target=control, daemon=True).start()
    if args.profile:
        threading.Thread(target=sample_stacks, args=(args.profile,), daemon=True).start()
    n = args.workers
    spec = JobSpec.of(
        name="master-scale", model_def=str(ROOT / "model_zoo" / "digits_torch.py") + ":Model",
        training_data=str(Path(args.data) / "train"), job_dir=args.job_dir,
        workers=n, min_workers=1, max_workers=n, epochs=100000, global_batch_size=64, steps_per_task=4,
        rendezvous_timeout=30.0, worker_timeout=120.0, start_timeout=600.0,
    )
    return run_master(spec, backend=backend, console=Console(file=sys.stderr))


def time_handlers() -> dict[str, list[float]]:
    """Time the master's own handling of the frequent RPCs (inside the servicer: no transport, no
    queueing), by wrapping the servicer's methods; returns the lists the times go to (ms)."""
    import functools

    from flextrain.master.servicer import MasterServicer

    times: dict[str, list[float]] = {}
    for name, kind in (("Heartbeat", "heartbeat"), ("GetTask", "get_task"), ("ReportTask", "report_task")):
        original = getattr(MasterServicer, name)
        sink = times.setdefault(kind, [])

        if asyncio.iscoroutinefunction(original):
            @functools.wraps(original)
            async def timed(self, request, context, original=original, sink=sink):
                t = time.perf_counter()
                try:
                    return await original(self, request, context)
                finally:
                    sink.append((time.perf_counter() - t) * 1000.0)
        else:  # a thread-pool servicer (the master before issue 26): same measure
            @functools.wraps(original)
            def timed(self, request, context, original=original, sink=sink):
                t = time.perf_counter()
                try:
                    return original(self, request, context)
                finally:
                    sink.append((time.perf_counter() - t) * 1000.0)

        setattr(MasterServicer, name, timed)
    _time_master_internals(times)
    return times


def _time_master_internals(times: dict[str, list[float]]) -> None:
    """Where a call's wait in the master comes from besides its handling: ``loop_lag`` (how late the
    server's event loop runs a 10 ms sleep: the CPU and the GIL held elsewhere) and the main loop's
    periodic work under the job's lock, ``status`` (status.json) and ``tick`` (deadlines, hang checks)."""
    import functools

    from flextrain.master.coordinator import JobMaster
    from flextrain.master.servicer import MasterServicer
    from flextrain.master.status import StatusReporter

    lag = times.setdefault("loop_lag", [])

    async def probe() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            lag.append((time.perf_counter() - t) * 1000.0 - 10.0)

    bind = MasterServicer.bind

    def bind_and_probe(self, loop):
        bind(self, loop)
        loop.create_task(probe())  # bind runs on the server's loop

    MasterServicer.bind = bind_and_probe
    for owner, name, kind in ((StatusReporter, "update", "status"), (JobMaster, "tick", "tick")):
        original, sink = getattr(owner, name), times.setdefault(kind, [])

        @functools.wraps(original)
        def timed(*a, original=original, sink=sink, **kw):
            t = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                sink.append((time.perf_counter() - t) * 1000.0)

        setattr(owner, name, timed)


PROFILING = [False]  # sample_stacks samples while true (the bench's phase of interest)
IDLE = ("wait", "select", "_worker", "poll", "sleep", "_wait_once", "accept", "readline", "get", "_recv")


def sample_stacks(path: str, period: float = 0.005) -> None:
    """A sampling profiler (no sys.setprofile): every ``period`` the stacks of the master's threads;
    a thread whose innermost frame is a wait is idle. Writes the top frames (self and inclusive) to
    ``path`` every few seconds."""
    import collections

    me = threading.get_ident()
    own, inclusive = collections.Counter(), collections.Counter()
    samples, last = 0, time.monotonic()
    while True:
        time.sleep(period)
        if not PROFILING[0]:
            continue
        samples += 1
        for tid, frame in sys._current_frames().items():
            if tid == me:
                continue
            leaf = frame.f_code.co_name
            if leaf in IDLE:
                continue
            own[f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{leaf}:{frame.f_lineno}"] += 1
            seen = set()
            while frame is not None:
                key = f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_code.co_name}"
                if key not in seen:
                    seen.add(key)
                    inclusive[key] += 1
                frame = frame.f_back
        if time.monotonic() - last > 0.5:
            last = time.monotonic()
            with open(path, "w") as f:
                json.dump({"samples": samples, "period": period, "self": own.most_common(40),
                           "inclusive": inclusive.most_common(60)}, f, indent=1)


# ---------------------------------------------------------------------------------------------------------
# simulated workers
# ---------------------------------------------------------------------------------------------------------
class Stats:
    def __init__(self) -> None:
        self.on = False
        self.ms: dict[str, list[float]] = {"get_task": [], "report_task": [], "heartbeat": [], "join": [],
                                           "handoff": [], "loop_lag": []}
        self.errors: dict[str, int] = {}

    def add(self, kind: str, ms: float) -> None:
        if self.on:
            self.ms[kind].append(ms)

    def error(self, kind: str, exc: BaseException) -> None:
        key = f"{kind}: {type(exc).__name__}: {getattr(exc, 'code', lambda: '')()}"
        self.errors[key] = self.errors.get(key, 0) + 1


class Handoff:
    """Rank 0's task answers to the other members of its round. A real round broadcasts each over its
    process group (flextrain/worker/round_tasks.py), never through the master; here rank 0's process
    sends it, keyed by (round, task index), to every simulating process in one UDP datagram on loopback."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.peers: list[int] = []  # every simulating process's port, this one's too
        self.answers: dict[tuple[int, int], asyncio.Future] = {}
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self._readable)

    def _future(self, round_id: int, index: int) -> asyncio.Future:
        return self.answers.setdefault((round_id, index), asyncio.get_running_loop().create_future())

    def _readable(self) -> None:
        import struct

        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            fut = self._future(*struct.unpack("<qq", data[:16]))
            if not fut.done():
                fut.set_result(data[16:])

    def publish(self, round_id: int, index: int, answer) -> None:
        import struct

        data = struct.pack("<qq", round_id, index) + answer.SerializeToString()
        for port in self.peers:
            self.sock.sendto(data, ("127.0.0.1", port))

    async def answer(self, round_id: int, index: int, pb):
        return pb.GetTaskResponse.FromString(await asyncio.shield(self._future(round_id, index)))


class SimWorker:
    def __init__(self, wid: str, address: str, stats: Stats, events: "SimEvents", *, handoff: Handoff | None,
                 report_tasks: bool) -> None:
        """``handoff``: only rank 0 asks for tasks and hands them over (None: every member asks)."""
        import grpc

        from flextrain.proto import flextrain_pb2 as pb
        from flextrain.proto import flextrain_pb2_grpc as pb_grpc

        self.pb = pb
        self.wid = wid
        # One connection per client, as one worker process has (no subchannel shared in this process).
        self.channel = grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        self.stub = pb_grpc.MasterStub(self.channel)
        self.stats = stats
        self.events = events
        self.position = pb.Position(round_id=-1)
        self.interval = 1.0
        self.failed = asyncio.Event()  # "my collective failed": re-join now
        self.tasks: list[asyncio.Task] = []
        self.round_id = -1
        self.rank = 0
        self.handoff = handoff
        self.report_tasks = report_tasks

    async def timed(self, kind: str, call, request, timeout: float = 10.0):
        t = time.perf_counter()
        try:
            return await call(request, timeout=timeout)
        finally:
            self.stats.add(kind, (time.perf_counter() - t) * 1000.0)

    async def start(self, task_seconds: float) -> None:
        pb = self.pb
        spec = await self.stub.GetJobSpec(pb.GetJobSpecRequest(worker_id=self.wid), timeout=30)
        self.interval = spec.heartbeat_interval or 1.0
        await self.stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id=self.wid, host="sim", pid=os.getpid()),
                                       timeout=30)
        self.tasks.append(asyncio.create_task(self.heartbeats()))
        self.tasks.append(asyncio.create_task(self.rounds(task_seconds)))

    async def heartbeats(self) -> None:
        pb = self.pb
        await asyncio.sleep(random.random() * self.interval)
        while True:
            t = time.monotonic()
            try:
                await self.timed("heartbeat", self.stub.Heartbeat, pb.HeartbeatRequest(
                    worker_id=self.wid, position=self.position, loss=0.5, samples=64), timeout=5.0)
            except Exception as exc:  # noqa: BLE001 - counted; a real worker retries next period
                self.stats.error("heartbeat", exc)
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - t)))

    async def rounds(self, task_seconds: float) -> None:
        pb = self.pb
        reason = "start"
        while True:
            resp = None
            while resp is None or resp.action == pb.JoinRendezvousResponse.WAIT:
                try:
                    resp = await self.timed("join", self.stub.JoinRendezvous, pb.JoinRendezvousRequest(
                        worker_id=self.wid, position=self.position, reason=reason), timeout=30.0)
                except Exception as exc:  # noqa: BLE001
                    self.stats.error("join", exc)
                    await asyncio.sleep(0.1)
            if resp.action == pb.JoinRendezvousResponse.STOP:
                return
            self.round_id, self.rank = resp.round_id, resp.rank
            self.events.trained(self, resp.round_id, time.monotonic())
            self.position = pb.Position(round_id=resp.round_id, task_index=0, steps_done=0,
                                        version=max(resp.version, self.position.version))
            self.failed.clear()
            train = asyncio.create_task(self.train(task_seconds))
            failed = asyncio.create_task(self.failed.wait())
            done, _ = await asyncio.wait({train, failed}, return_when=asyncio.FIRST_COMPLETED)
            train.cancel()
            failed.cancel()
            reason = "collective_failed" if failed in done else "round_changed"

    async def train(self, task_seconds: float) -> None:
        pb = self.pb
        asks = self.handoff is None or self.rank == 0  # rank 0 asks for the round (--task-asks every: all do)
        index, ahead = 0, None
        while True:
            if asks:
                resp = ahead
                if resp is None or resp.action != pb.GetTaskResponse.RUN:
                    resp = await self.timed("get_task", self.stub.GetTask, pb.GetTaskRequest(
                        worker_id=self.wid, round_id=self.round_id, task_index=index, position=self.position))
                if self.handoff is not None:
                    self.handoff.publish(self.round_id, index, resp)
            else:
                t = time.perf_counter()
                resp = await self.handoff.answer(self.round_id, index, pb)
                self.stats.add("handoff", (time.perf_counter() - t) * 1000.0)
            if resp.action != pb.GetTaskResponse.RUN:
                return
            task = resp.task
            steps = -(-(task.end - task.start) // task.global_batch_size)
            await asyncio.sleep(max(0.0, task_seconds - STEP_SECONDS))
            if asks:
                ahead = await self.timed("get_task", self.stub.GetTask, pb.GetTaskRequest(
                    worker_id=self.wid, round_id=self.round_id, task_index=index + 1, position=self.position,
                    ahead=True, ahead_count=1))
            await asyncio.sleep(STEP_SECONDS)
            self.position = pb.Position(round_id=self.round_id, task_index=index + 1, steps_done=0,
                                        version=self.position.version + steps)
            if self.report_tasks:
                await self.timed("report_task", self.stub.ReportTask,
                                 pb.ReportTaskRequest(worker_id=self.wid, task_id=task.task_id, ok=True))
            index += 1

    async def leave(self) -> None:
        for t in self.tasks:
            t.cancel()
        await self.channel.close()


class SimEvents:
    def __init__(self, n: int) -> None:
        self.n = n
        self.first: dict[str, float] = {}
        self.after_fail: dict[str, float] = {}
        self.fail_round: int | None = None
        self.all_trained = asyncio.Event()
        self.all_reformed = asyncio.Event()
        self.survivors: set[str] = set()

    def trained(self, w: SimWorker, round_id: int, at: float) -> None:
        self.first.setdefault(w.wid, at)
        if len(self.first) == self.n:
            self.all_trained.set()
        if self.fail_round is not None and round_id > self.fail_round and w.wid in self.survivors:
            self.after_fail.setdefault(w.wid, at)
            if len(self.after_fail) == len(self.survivors):
                self.all_reformed.set()


def out(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


async def sim_main(args) -> None:
    ids = args.ids.split(",")
    stats = Stats()
    events = SimEvents(len(ids))
    handoff = Handoff() if args.task_asks == "rank0" else None
    report = args.report_tasks or handoff is None  # the simulation before rank 0 asked: every member reports
    workers = {wid: SimWorker(wid, args.address, stats, events, handoff=handoff, report_tasks=report) for wid in ids}
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue = asyncio.Queue()
    pending = [b""]

    def readable() -> None:
        chunk = os.read(sys.stdin.fileno(), 1 << 16)
        if not chunk:
            loop.remove_reader(sys.stdin.fileno())
            commands.put_nowait("")
            return
        *lines, pending[0] = (pending[0] + chunk).split(b"\n")
        for line in lines:
            commands.put_nowait(line.decode())

    loop.add_reader(sys.stdin.fileno(), readable)
    out({"event": "port", "port": handoff.port if handoff else 0})
    peers = json.loads(await commands.get())  # {"cmd": "peers"}: the handoff's destinations, then start
    if handoff is not None:
        handoff.peers = peers["ports"]
    # Start-up spread over a second: workers do not all become ready at the same instant.
    for w in workers.values():
        asyncio.get_running_loop().call_later(random.random(), lambda w=w: asyncio.ensure_future(
            w.start(args.task_seconds)))

    async def announce_trained():
        await events.all_trained.wait()
        out({"event": "trained", "at": max(events.first.values()),
             "heartbeat_interval": next(iter(workers.values())).interval})

    asyncio.ensure_future(announce_trained())

    async def lag() -> None:  # how late this process's event loop runs a 10 ms sleep (client-side starvation)
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            stats.add("loop_lag", (time.perf_counter() - t) * 1000.0 - 10.0)

    asyncio.ensure_future(lag())
    while True:
        line = await commands.get()
        if not line:
            return
        cmd = json.loads(line)
        if cmd["cmd"] == "mark":
            stats.on = True
            for v in stats.ms.values():
                v.clear()
        elif cmd["cmd"] == "unmark":
            stats.on = False
            out({"event": "stats", "ms": stats.ms, "errors": stats.errors})
        elif cmd["cmd"] == "leave":
            gone = [workers.pop(w) for w in cmd["ids"] if w in workers]
            await asyncio.gather(*(w.leave() for w in gone))
            out({"event": "left", "n": len(gone)})
        elif cmd["cmd"] == "fail":
            events.survivors = set(workers)
            events.fail_round = max(w.round_id for w in workers.values()) if workers else 0
            for w in workers.values():
                w.failed.set()

            async def announce_reformed():
                try:
                    await asyncio.wait_for(events.all_reformed.wait(), timeout=cmd["timeout"])
                except asyncio.TimeoutError:
                    pass
                out({"event": "reformed", "times": events.after_fail, "survivors": len(events.survivors)})

            asyncio.ensure_future(announce_reformed())
        elif cmd["cmd"] == "quit":
            for w in workers.values():
                for t in w.tasks:
                    t.cancel()
            out({"event": "quit"})
            return


def run_sim_role(args) -> int:
    asyncio.run(sim_main(args))
    os._exit(0)  # channels of cancelled clients: no slow teardown


# ---------------------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Proc:
    def __init__(self, cmd: list[str], name: str, stderr) -> None:
        self.name = name
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                  bufsize=1, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})

    def send(self, obj) -> None:
        self.p.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.p.stdin.flush()

    def readline(self, timeout: float) -> str:
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"{self.name}: no output within {timeout:.0f}s")
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited (code {self.p.poll()})")
        return line

    def expect(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            line = self.readline(max(0.1, deadline - time.monotonic()))
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("event") == event:
                return obj


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help=f"small sizes ({SMOKE}); default {FULL}")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--procs", type=int, help="simulating processes")
    ap.add_argument("--steady", type=float, help="seconds of the measured steady window")
    ap.add_argument("--task-seconds", type=float, help="simulated time a task takes")
    ap.add_argument("--leave-fraction", type=float, default=0.1)
    ap.add_argument("--work-dir", help="keep data, job dir and logs here (default: a temp dir)")
    ap.add_argument("--task-asks", choices=("rank0", "every"), default="rank0",
                    help="rank0: only rank 0 of the round asks for tasks and hands the answers to the others, as "
                    "workers do since issue 26 item 4; every: every member asks for every task and reports it "
                    "(the workers and this bench before that)")
    ap.add_argument("--report-tasks", action="store_true",
                    help="every member also reports each finished task (ReportTask ok), as --task-asks every does")
    ap.add_argument("--heartbeats-per-second", type=float,
                    help="the master's heartbeat budget (flextrain.master.main.HEARTBEATS_PER_SECOND) for this run")
    ap.add_argument("--profile-phase", choices=("steady", "leave"), default="steady")
    ap.add_argument("--profile", metavar="FILE", help="sample the master's stacks in-process (py-spy cannot read this "
                    "Python) and write the top frames to FILE (JSON; sampling costs the master some CPU)")
    ap.add_argument("--role", choices=("driver", "master", "sim"), default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--job-dir", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = dict(SMOKE if args.smoke else FULL)
    for key in sizes:
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
        setattr(args, key, sizes[key])
    if args.role == "master":
        return run_master_role(args)
    if args.role == "sim":
        return run_sim_role(args)
    if args.work_dir:
        work = Path(args.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        return drive(args, sizes, work)
    with tempfile.TemporaryDirectory(prefix="master-scale-") as tmp:
        return drive(args, sizes, Path(tmp))


def drive(args, sizes: dict, work: Path) -> int:
    from flextrain.data.digits import write_digits

    write_digits(work / "data")
    me = [sys.executable, str(Path(__file__).resolve())]
    n, procs = args.workers, args.procs
    master_log = open(work / "master.log", "w")
    master = Proc([*me, "--role", "master", "--workers", str(n), "--data", str(work / "data"),
                   "--job-dir", str(work / "job"), *(["--profile", args.profile] if args.profile else []),
                   *(["--heartbeats-per-second", str(args.heartbeats_per_second)] if args.heartbeats_per_second
                     else [])],
                  "master", master_log)
    sims: list[Proc] = []
    try:
        address = None
        while address is None:
            line = master.readline(120)
            if line.startswith("ADDRESS "):
                address = line.split()[1]
        log(f"master {master.p.pid} at {address}; starting {n} simulated workers in {procs} processes")
        ids = [f"worker-{i}" for i in range(n)]
        shares = [ids[i::procs] for i in range(procs)]
        sim_log = open(work / "sims.log", "w")
        t_start = time.monotonic()
        for i, share in enumerate(shares):
            sims.append(Proc([*me, "--role", "sim", "--address", address, "--ids", ",".join(share),
                              "--task-seconds", str(args.task_seconds), "--task-asks", args.task_asks,
                              *(["--report-tasks"] if args.report_tasks else [])], f"sim-{i}", sim_log))
        ports = [s.expect("port", 60)["port"] for s in sims]
        for s in sims:
            s.send({"cmd": "peers", "ports": ports})
        trained = [s.expect("trained", 300) for s in sims]
        first = max(t["at"] for t in trained)
        heartbeat_interval = trained[0]["heartbeat_interval"]
        log(f"first round of {n} formed and known to all ({first - t_start:.2f}s after the clients started)")
        time.sleep(max(1.0, 2 * args.task_seconds))  # into the steady state
        for s in sims:
            s.send({"cmd": "mark"})
        master.send("mark")
        if args.profile and args.profile_phase == "steady":
            master.send("prof_on")
        sim_cpu0 = sum(cpu_seconds(s.p.pid) for s in sims)
        cpu0, t0 = cpu_seconds(master.p.pid), time.monotonic()
        time.sleep(args.steady)
        cpu1, t1 = cpu_seconds(master.p.pid), time.monotonic()
        master.send("prof_off")
        sim_cpu = sum(cpu_seconds(s.p.pid) for s in sims) - sim_cpu0
        master.send("handlers")
        handlers = {}
        while not handlers:
            line = master.readline(30)
            if line.startswith("HANDLERS "):
                handlers = json.loads(line.split(" ", 1)[1])
        for s in sims:
            s.send({"cmd": "unmark"})
        ms: dict[str, list[float]] = {}
        errors: dict[str, int] = {}
        for s in sims:
            st = s.expect("stats", 60)
            for k, v in st["ms"].items():
                ms.setdefault(k, []).extend(v)
            for k, v in st["errors"].items():
                errors[k] = errors.get(k, 0) + v
        log(f"steady window done: master CPU {cpu1 - cpu0:.2f}s over {t1 - t0:.2f}s")

        # 10 % leave at once: they stop, the master learns of their exit, the survivors' collective fails.
        leavers = ids[:: max(1, round(1 / args.leave_fraction))] if args.leave_fraction > 0 else []
        for s in sims:
            s.send({"cmd": "leave", "ids": leavers})
        for s in sims:
            s.expect("left", 60)
        cpu2 = cpu_seconds(master.p.pid)
        if args.profile and args.profile_phase == "leave":
            master.send("prof_on")
        master.send("exit " + " ".join(leavers))
        t_leave = time.monotonic()
        for s in sims:
            s.send({"cmd": "fail", "timeout": 60})
        times: list[float] = []
        survivors = 0
        for s in sims:
            r = s.expect("reformed", 90)
            times.extend(v - t_leave for v in r["times"].values())
            survivors += r["survivors"]
        cpu3 = cpu_seconds(master.p.pid)
        master.send("prof_off")
        exited_at = None
        try:
            line = master.readline(5)
            if line.startswith("EXITED "):
                exited_at = float(line.split()[1]) - t_leave
        except (TimeoutError, RuntimeError):
            pass
        log(f"{len(leavers)} left; {len(times)}/{survivors} survivors in the new round, the last "
            f"{max(times) if times else float('nan'):.3f}s after the leave")
        for s in sims:
            s.send({"cmd": "quit"})
        steady = t1 - t0
        cpu = cpu1 - cpu0
        result = {
            "bench": "master_scale",
            "heartbeat_interval_s": heartbeat_interval,
            "sizes": {"workers": n, "procs": procs, "steady_s": args.steady, "task_seconds": args.task_seconds,
                      "leave_fraction": args.leave_fraction, "smoke": SMOKE, "full": FULL},
            "task_asks": args.task_asks,
            "report_tasks": args.report_tasks or args.task_asks == "every",
            "get_task_ms": percentiles(ms.get("get_task", [])),
            "report_task_ms": percentiles(ms.get("report_task", [])),
            "heartbeat_ms": percentiles(ms.get("heartbeat", [])),
            # --task-asks rank0: how long a member waited at a task boundary for rank 0's answer
            "handoff_ms": percentiles(ms.get("handoff", [])),
            "get_task_per_s": round(len(ms.get("get_task", [])) / steady, 1),
            "rpc_per_s": round(sum(len(v) for k, v in ms.items() if k not in ("join", "handoff", "loop_lag"))
                               / steady, 1),
            "master_handler_ms": {k: percentiles(handlers.pop(k)) for k in ("heartbeat", "get_task", "report_task")},
            # the server's event loop: how late a 10 ms sleep wakes (CPU and GIL taken by others)
            "master_loop_lag_ms": percentiles(handlers.pop("loop_lag")),
            # the master's main loop, each pass under the job's lock: status.json, tick (hang checks)
            "master_periodic_ms": {k: percentiles(v) for k, v in handlers.items()},
            "client_loop_lag_ms": percentiles(ms.get("loop_lag", [])),
            "clients_cpu_cores": round(sim_cpu / (t1 - t0), 3),
            "errors": errors,
            "first_round_s": round(first - t_start, 3),
            "formation_s": {"left": len(leavers), "survivors": survivors, "reformed": len(times),
                            "last": round(max(times), 3) if times else None,
                            "p50": percentiles(times)["p50"],
                            "master_heard_exits_s": round(exited_at, 3) if exited_at is not None else None},
            "master_cpu": {"seconds": round(cpu, 3), "window_s": round(steady, 3),
                           "cores": round(cpu / steady, 3),
                           "per_worker_per_s": cpu / steady / n,
                           "leave_seconds": round(cpu3 - cpu2, 3)},
            "targets": {"p99_ms": TARGET_P99_MS, "formation_s": TARGET_FORMATION_S},
        }
        p99s = [result[k]["p99"] for k in ("get_task_ms", "report_task_ms", "heartbeat_ms") if result[k]["n"]]
        result["met"] = {"p99": all(p < TARGET_P99_MS for p in p99s),
                         "formation": bool(times) and len(times) == survivors and max(times) < TARGET_FORMATION_S}
        result["method"] = ("real master (run_master, AllReduce JobSpec over the digits data, SimBackend launch "
                            "backend) + simulated workers (grpc.aio, one channel each, in --procs processes; "
                            "--task-asks rank0: rank 0 asks for the round's tasks and hands them over by UDP); "
                            "client-side latencies over the steady window; formation: leave (master told of the "
                            "exits, survivors' collectives fail) -> every survivor holds the new round's TRAIN; "
                            "master CPU from /proc over the steady window")
        print(json.dumps(result))
        return 0
    finally:
        for s in sims:
            if s.p.poll() is None:
                try:
                    s.p.wait(5)
                except subprocess.TimeoutExpired:
                    s.p.kill()
        if master.p.poll() is None:
            master.p.kill()
            master.p.wait(10)
        master_log.close()


if __name__ == "__main__":
    sys.exit(main())
