"""A worker still blocked in a collective when the job is over leaves it (gloo cannot abort one).

A real master (JobMaster behind its gRPC servicer on loopback) and a real worker process running
the heartbeat loop: the worker's training thread is "blocked in the collective" of a round whose
other member failed, and the job is over. It must exit with ExitCode.RELEASED instead of waiting
out gloo's timeout; blocked in the rendezvous (an RPC that the master answers) it must not.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from flextrain.failures import ExitCode
from flextrain.master.coordinator import Phase
from flextrain.master.servicer import MasterServicer, start_server

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "master"))
from test_coordinator import form, make_master  # noqa: E402

WORKER = textwrap.dedent("""
    import sys, threading
    from flextrain.worker.client import MasterClient
    from flextrain.worker.main import _heartbeat_loop
    from flextrain.worker.trainer import WorkerState

    address, in_rendezvous = sys.argv[1], sys.argv[2] == "1"
    state = WorkerState(round_id=0, waiting=True, in_rendezvous=in_rendezvous)
    done = threading.Event()
    client = MasterClient(address, "w0")
    beat, answers = client.heartbeat, []

    def counted(*args, **kwargs):  # end the loop after 40 answers (4 s of beats, twice the release grace)
        answers.append(beat(*args, **kwargs))
        if len(answers) >= 40:
            done.set()
        return answers[-1]

    client.heartbeat = counted
    _heartbeat_loop(client, state, 0.1, done)
    print("loop ended after", len(answers), "beats, job over in all:", all(a.job_over for a in answers),
          flush=True)
""")


@pytest.fixture
def dead_round(tmp_path):
    master, clock = make_master(tmp_path, workers=2)
    form(master, clock, ["w0", "w1"])
    master.worker_exited("w1")  # w1 is gone, w0 still "in its all-reduce" ...
    master.finish(Phase.FAILED, "w1 failed")  # ... and the job is over
    servicer = MasterServicer(master, status_json=lambda: "{}", stop=lambda r: (True, ""),
                              scale=lambda n: (True, ""), heartbeat_interval=0.1)
    server, port = start_server(servicer, host="127.0.0.1", port=0, threads=4)
    yield f"127.0.0.1:{port}"
    server.stop(grace=0)


def test_blocked_in_a_dead_rounds_collective_the_worker_leaves(dead_round):
    proc = subprocess.run([sys.executable, "-c", WORKER, dead_round, "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == ExitCode.RELEASED, proc.stderr
    assert "still blocked in a collective" in proc.stderr


def test_waiting_in_the_rendezvous_is_not_blocked(dead_round):
    proc = subprocess.run([sys.executable, "-c", WORKER, dead_round, "1"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "loop ended after 40 beats, job over in all: True" in proc.stdout, proc.stderr
