"""The zygote (flextrain/zygote.py): local children forked with torch already imported behave as fresh
``python -m ...`` processes (their own arguments, environment, directory, streams, session, command
line and exit code); a launch it cannot serve starts a fresh process; nothing outlives a dead owner;
a real job's preflight and workers are forked from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from flextrain.master.launcher import InstanceSpec, LocalProcessBackend, Role
from flextrain.zygote import ENV_SWITCH, Zygote
from ft_helpers import DIGITS_MODEL, alive, command_line, run_flextrain, wait_for

SCRIPT = "flextrain.worker.script_child"  # runs a file as `python FILE ARGS` would: the probe below
# What a child sees, printed as one JSON line; then it blocks on stdin until the test closes it
PROBE = textwrap.dedent("""
    import json, os, sys
    import numpy
    print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "seen": os.environ.get("FT_ZYGOTE_PROBE"),
                      "parent": os.environ.get("FLEXTRAIN_PARENT_PID"), "ppid": os.getppid(),
                      "sid": os.getsid(0), "pid": os.getpid(), "torch": "torch" in sys.modules,
                      "draw": int(numpy.random.randint(0, 2**31))}), flush=True)
    sys.stdin.read()
    sys.exit(int(os.environ.get("FT_ZYGOTE_EXIT", "0")))
""")


@pytest.fixture(scope="module")
def zygote():
    z = Zygote.for_local_job()
    assert z is not None
    yield z
    z.close()


class Probe:
    """A probe forked from ``zygote``: ``report`` once it has printed; ``release()`` lets it exit."""

    def __init__(self, zygote: Zygote, tmp_path, *args: str, env: dict[str, str] | None = None) -> None:
        script = tmp_path / "probe.py"
        script.write_text(PROBE)
        read, self._write = os.pipe()
        self.out = tmp_path / f"probe-{len(list(tmp_path.glob('probe-*')))}.out"
        with open(self.out, "wb") as out:
            self.child = zygote.spawn((str(script), *args), env={**zygote.env, **(env or {})}, stdin=read,
                                      stdout=out.fileno(), stderr=out.fileno(), module=SCRIPT)
        os.close(read)
        self.report = wait_for(lambda: self._line(), timeout=60, what="the probe's report")

    def _line(self) -> dict | None:
        lines = self.out.read_text().splitlines()
        return json.loads(lines[0]) if lines and lines[0].startswith("{") else None

    def release(self) -> int:
        os.close(self._write)
        return self.child.wait()


def test_a_forked_child_is_the_process_its_command_line_describes(zygote, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    probe = Probe(zygote, tmp_path, "a b", "c", env={"FT_ZYGOTE_PROBE": "mine", "FT_ZYGOTE_EXIT": "3"})
    report = probe.report
    assert report["argv"] == [str(tmp_path / "probe.py"), "a b", "c"]
    assert report["cwd"] == str(tmp_path) and report["seen"] == "mine"
    assert report["torch"]  # imported before the fork: the point of the zygote
    assert report["ppid"] == zygote.pid and report["sid"] == report["pid"] == probe.child.pid  # its own session
    assert command_line(probe.child.pid)[:3] == [sys.executable, "-m", SCRIPT]  # what ps shows
    assert probe.release() == 3  # its own exit code, reported by the zygote


def test_a_child_killed_by_a_signal_reports_it_as_popen_does(zygote, tmp_path):
    probe = Probe(zygote, tmp_path)
    probe.child.kill()
    assert probe.child.wait() == -signal.SIGKILL
    probe.child.kill()  # once reaped, its pid may be another process's: nothing is sent


def test_children_draw_their_own_random_numbers(zygote, tmp_path):
    first, second = Probe(zygote, tmp_path), Probe(zygote, tmp_path)
    assert first.report["draw"] != second.report["draw"]  # numpy's global generator seeded per child
    assert first.release() == second.release() == 0


def test_an_environment_that_differs_where_imports_read_it_is_not_served(zygote):
    assert zygote.serves({**zygote.env, "FT_ANYTHING": "1", "FLEXTRAIN_WORKER_ID": "worker-3"})
    for name in ("OMP_NUM_THREADS", "PYTHONPATH", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES", "TORCH_HOME"):
        assert not zygote.serves({**zygote.env, name: "7"}), name


# Run in a child forked after preload("tensorflow"): TensorFlow was there before the child imported it,
# and its runtime, started first in the child, trains a Keras model (the zygote itself never ran an op)
KERAS_CHILD = textwrap.dedent("""
    import json, sys
    loaded = "tensorflow" in sys.modules
    import numpy, tensorflow as tf
    model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    model.fit(numpy.ones((8, 3), "float32"), numpy.full((8, 1), 3.0, "float32"), epochs=40, verbose=0)
    print(json.dumps({"loaded": loaded, "prediction": float(model.predict(numpy.ones((1, 3)), verbose=0)[0, 0])}))
""")


def test_a_preloaded_framework_reaches_the_children_forked_after_it(tmp_path):
    pytest.importorskip("tensorflow")
    zygote = Zygote.start(env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    try:
        assert zygote.serves({**zygote.env, "TF_ENABLE_ONEDNN_OPTS": "0"})  # TensorFlow not loaded: nothing read
        zygote.preload("tensorflow")
        zygote.preload("tensorflow")  # once only
        assert zygote.preloaded == ("tensorflow",)
        assert not zygote.serves({**zygote.env, "TF_ENABLE_ONEDNN_OPTS": "0"})  # read as it loaded
        assert not zygote.serves({**zygote.env, "KERAS_BACKEND": "jax"})
        # unset, TF_CPP_MIN_LOG_LEVEL is "2" for the preload's import and the children's (as they set it)
        assert zygote.serves({**zygote.env, "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert not zygote.serves({**zygote.env, "TF_CPP_MIN_LOG_LEVEL": "1"})
        script, out = tmp_path / "keras_child.py", tmp_path / "keras_child.out"
        script.write_text(KERAS_CHILD)
        with open(out, "wb") as sink, open(os.devnull, "rb") as null:
            child = zygote.spawn((str(script),), env=zygote.env, stdin=null.fileno(), stdout=sink.fileno(),
                                 stderr=sink.fileno(), module=SCRIPT)
        assert child.wait(timeout=300) == 0, out.read_text()[-3000:]
        report = json.loads(out.read_text().strip().splitlines()[-1])
        assert report["loaded"] and report["prediction"] == pytest.approx(3.0, abs=0.05), report
    finally:
        zygote.close()


def _ps_spec(tmp_path, name: str, **env: str) -> InstanceSpec:
    return InstanceSpec(name, Role.PS, 0, ("ps", "--shard-index", "0", "--num-ps", "1", "--port", "0",
                                           "--address-file", str(tmp_path / f"{name}.addr"), "--no-wal"), env)


def test_the_local_backend_forks_what_it_can_and_reports_every_exit(tmp_path):
    backend = LocalProcessBackend(log_dir=tmp_path / "logs", zygote=Zygote.for_local_job())
    exits: dict[str, int] = {}
    ended = threading.Condition()

    def on_exit(instance_id: str, code: int) -> None:
        with ended:
            exits[instance_id] = code
            ended.notify_all()

    backend.on_exit(on_exit)
    try:
        backend.launch(_ps_spec(tmp_path, "ps-0"))
        backend.launch(_ps_spec(tmp_path, "ps-1", OMP_NUM_THREADS="1"))  # read as torch loads: a fresh process
        assert backend.forked == 1
        for name in ("ps-0", "ps-1"):
            wait_for((tmp_path / f"{name}.addr").exists, timeout=60, what=f"{name} to serve")
        assert command_line(backend.pid("ps-0"))[:4] == [sys.executable, "-m", "flextrain", "ps"]
        backend.terminate("ps-0", force=True)
        backend.terminate("ps-1", force=True)
        with ended:
            assert ended.wait_for(lambda: len(exits) == 2, timeout=60)
        assert exits == {"ps-0": 137, "ps-1": 137}  # the shell's convention, forked or not
        assert "ps-0" not in backend.running()
    finally:
        backend.close()
    assert backend.zygote.proc.poll() is not None  # closed with the backend


def test_a_forked_parameter_server_exits_when_its_owner_is_killed(tmp_path):
    addr = tmp_path / "ps.addr"
    # A stand-in master: a zygote, a PS forked from it; then the master is SIGKILLed.
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys
        from flextrain.zygote import Zygote
        z = Zygote.for_local_job()
        with open(os.devnull, "rb") as null:
            child = z.spawn(("ps", "--shard-index", "0", "--num-ps", "1", "--port", "0", "--address-file",
                             {str(addr)!r}, "--no-wal"), env={{**z.env, "FLEXTRAIN_PARENT_PID": str(z.pid)}},
                            stdin=null.fileno(), stdout=2, stderr=2)
        print(z.pid, child.pid, flush=True)
        child.wait()
    """)], stdout=subprocess.PIPE, text=True)
    zygote_pid, ps_pid = map(int, owner.stdout.readline().split())
    wait_for(addr.exists, timeout=60, what="the PS to serve")
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    wait_for(lambda: not alive(zygote_pid), timeout=30, what="the zygote to exit with its owner")
    wait_for(lambda: not alive(ps_pid), timeout=30, what="the orphaned PS to exit")


def test_flextrain_zygote_0_turns_it_off(monkeypatch):
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert Zygote.for_local_job() is None


MARKING_MODEL = textwrap.dedent("""
    import importlib.util, os
    _spec = importlib.util.spec_from_file_location("digits_torch", {digits!r})
    _digits = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_digits)
    globals().update({{k: v for k, v in vars(_digits).items() if not k.startswith("_")}})
    with open(os.path.join({marks!r}, str(os.getpid())), "w") as _mark:  # who started this process
        _mark.write(open(f"/proc/{{os.getppid()}}/cmdline").read())
""")


def test_a_local_job_forks_its_preflight_and_workers(digits_data, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    module = tmp_path / "marking.py"
    module.write_text(MARKING_MODEL.format(digits=DIGITS_MODEL.split(":")[0], marks=str(marks)))
    done = run_flextrain("train", "--model-def", f"{module}:Model", "--training-data", str(digits_data / "train"),
                         "--workers", "2", "--epochs", "1", "--global-batch-size", "64", "--lr", "0.1",
                         "--job-dir", str(tmp_path / "job"), "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    parents = [m.read_text() for m in marks.iterdir()]
    # preflight and two workers imported the module, all forked; the training process itself did not (preflight
    # checked the module, and its source shows no custom_data_reader for the master to plan shards with)
    assert len(parents) == 3, parents
    assert all("flextrain.zygote" in p for p in parents), parents
