"""The M of each round (flextrain/master/memory.py) driven through JobMaster: --max-micro-batch auto takes the
smallest probe of the round's members, a newcomer with a smaller probe lowers it from the round it joins,
status shows M, how it was chosen and the workers' memory samples."""

from __future__ import annotations

from test_coordinator import G, JOIN, heartbeat, join, make_master, pos

from flextrain.master.status import StatusReporter
from flextrain.proto import flextrain_pb2 as pb


def probe(m: int, *, limit: int = 1 << 20) -> pb.MicroBatchProbe:
    return pb.MicroBatchProbe(max_micro_batch=m, memory_limit=limit, peak_bytes=limit - 1, device="cpu")


def snapshot(master, tmp_path) -> dict:
    reporter = StatusReporter(master, path=tmp_path / "status.json", desired=lambda: 2, master_address="x",
                              show_progress=False)
    try:
        return reporter.snapshot()
    finally:
        reporter.close()


def test_a_round_plans_with_the_smallest_probe_of_its_members(tmp_path):
    master, clock = make_master(tmp_path, workers=2, max_micro_batch="auto", memory_limit="1MiB")
    master.register("A", probe=probe(7))
    master.register("B", probe=probe(4))
    assert join(master, "A").action == JOIN.WAIT
    clock.now += 1
    b = join(master, "B")
    a = join(master, "A", pos(round_id=-1))
    assert (a.action, b.action) == (JOIN.TRAIN, JOIN.TRAIN)
    assert a.max_micro_batch == b.max_micro_batch == 4
    status = snapshot(master, tmp_path)
    assert status["maxMicroBatch"] == 4 and status["roundHistory"][-1]["maxMicroBatch"] == 4
    choice = status["maxMicroBatchChoice"]
    assert choice["setting"] == "auto" and choice["memoryLimit"] == "1MiB"
    assert {w: p["maxMicroBatch"] for w, p in choice["probes"].items()} == {"A": 7, "B": 4}
    assert any("max micro-batch 4" in e and "B's" in e for e in status["events"])


def test_a_newcomer_with_a_smaller_probe_lowers_m_from_the_round_it_joins(tmp_path):
    master, clock = make_master(tmp_path, workers=1, max_workers=2, max_micro_batch="auto")
    master.register("A", probe=probe(9))
    first = join(master, "A")
    assert first.max_micro_batch == 9
    master.register("C", probe=probe(3))  # ends the running round at its next step boundary
    clock.now += 1
    assert join(master, "C").action == JOIN.WAIT
    again = join(master, "A", pos(round_id=first.round_id, version=1))
    assert again.action == JOIN.TRAIN and again.round_id == first.round_id + 1
    assert again.max_micro_batch == join(master, "C").max_micro_batch == 3


def test_without_auto_every_round_gets_the_setting(tmp_path):
    master, _ = make_master(tmp_path, workers=1, max_micro_batch=5)
    master.register("A", probe=probe(2))  # a probe is ignored: M was set by hand
    assert join(master, "A").max_micro_batch == 5
    status = snapshot(master, tmp_path)
    assert status["maxMicroBatch"] == 5 and status["maxMicroBatchChoice"] == {"setting": 5}


def test_auto_without_any_probe_falls_back_to_the_global_batch(tmp_path):
    master, _ = make_master(tmp_path, workers=1, max_micro_batch="auto")
    master.register("A")
    assert join(master, "A").max_micro_batch == G


def test_memory_samples_show_per_member_and_the_job_peak(tmp_path):
    master, clock = make_master(tmp_path, workers=2)
    for w in "AB":
        master.register(w)
    join(master, "A")
    clock.now += 1
    join(master, "B")
    for wid, used, peak in (("A", 100, 150), ("B", 300, 400), ("A", 120, 160)):
        heartbeat(master, wid, pos(0, 0, 1, 1))
        master.heartbeat(pb.HeartbeatRequest(worker_id=wid, position=pos(0, 0, 1, 1), memory=pb.MemorySample(
            step=1, device="cpu", used_bytes=used, peak_bytes=peak)))
    status = snapshot(master, tmp_path)
    by_id = {m["id"]: m for m in status["members"]}
    assert by_id["A"]["memory"] == {"step": 1, "device": "cpu", "usedBytes": 120, "peakBytes": 160}
    assert by_id["B"]["memory"]["peakBytes"] == 400
    assert status["memoryPeak"] == {"peakBytes": 400, "worker": "B", "step": 1, "device": "cpu"}
