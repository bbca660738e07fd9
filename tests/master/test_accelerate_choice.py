"""The job's training strategy in the master (flextrain/master/accelerating.py) driven through JobMaster: with
--accelerate auto one worker searches while the others wait, the first choice sent is kept in
<job dir>/accelerate/strategy.json and handed to every worker after it, a searcher that leaves (or stays
silent past --start-timeout) hands the search on, a resumed job's master reads the kept choice, and
status.json (and the ElasticJob status) shows the strategy and how it was chosen."""

from __future__ import annotations

import json

from test_coordinator import make_master
from test_micro_batch_choice import snapshot

from flextrain.accelerate import Strategy
from flextrain.master.k8s_status import cr_status
from flextrain.proto import flextrain_pb2 as pb

A = pb.AccelerateResponse
CHOSEN = Strategy([("amp_native", "bf16"), ("checkpoint", ("Block",))])


def ask(master, worker, strategy: Strategy | None = None, search: dict | None = None):
    return master.accelerate(pb.AccelerateRequest(
        worker_id=worker, strategy_json=strategy.to_json(indent=None) if strategy is not None else "",
        search_json=json.dumps(search) if search is not None else ""))


def test_one_worker_searches_the_others_wait_and_all_use_its_choice(tmp_path):
    master, _ = make_master(tmp_path, workers=3, accelerate="auto")
    assert snapshot(master, tmp_path)["accelerate"] == {
        "setting": "auto", "strategy": None, "file": str(tmp_path / "accelerate" / "strategy.json"),
        "source": "not chosen yet"}
    assert ask(master, "w0").action == A.SEARCH
    waiting = ask(master, "w1")
    assert waiting.action == A.WAIT and waiting.source == "w0 is searching"
    assert snapshot(master, tmp_path)["accelerate"]["searcher"] == "w0"

    kept = ask(master, "w0", CHOSEN, {"chosen": "amp_native:bf16, checkpoint:Block", "seconds": 3.5})
    assert kept.action == A.USE and Strategy.load(kept.strategy_json) == CHOSEN and kept.source == "searched by w0"
    for worker in ("w1", "w2"):  # waiting, or new: nobody searches again
        answer = ask(master, worker)
        assert (answer.action, answer.strategy_json, answer.source) == (A.USE, kept.strategy_json, "searched by w0")
    # A later choice (a second searcher that raced) changes nothing: the first one sent is the job's.
    late = ask(master, "w1", Strategy(["channels_last"]))
    assert late.action == A.USE and Strategy.load(late.strategy_json) == CHOSEN

    path = tmp_path / "accelerate" / "strategy.json"
    assert Strategy.load(path) == CHOSEN  # a plain strategy file: --accelerate FILE reads it
    search = json.loads((tmp_path / "accelerate" / "search.json").read_text())
    assert search["worker"] == "w0" and search["seconds"] == 3.5
    status = snapshot(master, tmp_path)
    assert status["accelerate"]["strategy"] == "amp_native:bf16, checkpoint:Block"
    assert status["accelerate"]["source"] == "searched by w0" and status["accelerate"]["search"]["worker"] == "w0"
    assert [m["name"] for m in status["accelerate"]["methods"]] == ["amp_native", "checkpoint"]
    assert sum("searches for the job's training strategy" in e for e in status["events"]) == 1
    assert any("chosen by w0's search: amp_native:bf16, checkpoint:Block" in e for e in status["events"])
    assert cr_status(status, job_name="job")["accelerate"] == "amp_native:bf16, checkpoint:Block"


def test_a_searcher_that_leaves_or_goes_silent_hands_the_search_on(tmp_path):
    master, clock = make_master(tmp_path, workers=2, accelerate="auto", start_timeout=30.0)
    assert ask(master, "w0").action == A.SEARCH
    assert ask(master, "w1").action == A.WAIT
    master.worker_exited("w0")  # died while searching
    assert ask(master, "w1").action == A.SEARCH
    assert ask(master, "w0").action == A.WAIT  # relaunched: waits for w1 now
    clock.now += 31  # w1 silent past --start-timeout
    assert ask(master, "w0").action == A.SEARCH
    assert ask(master, "w0", Strategy()).action == A.USE  # "no methods" is a choice too
    assert ask(master, "w1").strategy_json == Strategy().to_json(indent=None)


def test_a_resumed_master_reads_the_kept_choice_and_nobody_searches(tmp_path):
    first, _ = make_master(tmp_path, workers=1, accelerate="auto")
    ask(first, "w0")
    ask(first, "w0", CHOSEN, {"chosen": "x"})
    again, _ = make_master(tmp_path, workers=1, accelerate="auto")  # a resume, or a relaunched master
    answer = ask(again, "w0")
    assert answer.action == A.USE and Strategy.load(answer.strategy_json) == CHOSEN
    assert answer.source == f"stored in {tmp_path / 'accelerate' / 'strategy.json'}, searched by w0"
    assert "not searching again" in again.accelerating.note


def test_an_unreadable_kept_choice_is_searched_again(tmp_path):
    (tmp_path / "accelerate").mkdir()
    (tmp_path / "accelerate" / "strategy.json").write_text("{not json")
    master, _ = make_master(tmp_path, workers=1, accelerate="auto")
    assert "cannot be read" in master.accelerating.note and "searches again" in master.accelerating.note
    assert ask(master, "w0").action == A.SEARCH


def test_a_given_strategy_is_described_and_nothing_is_searched(tmp_path):
    master, _ = make_master(tmp_path, workers=1, accelerate="amp_native:bf16,compile:eager")
    assert ask(master, "w0").action == A.USE  # the workers read a given strategy from the spec
    shown = snapshot(master, tmp_path)["accelerate"]
    assert shown["strategy"] == "amp_native:bf16, native_dynamo:eager" and shown["source"] == "given (--accelerate)"
    assert shown["methods"][1] == {"name": "native_dynamo", "config": {"backend": "eager"}}
    inline, _ = make_master(tmp_path / "j2", workers=1, accelerate=CHOSEN.to_json(indent=None))
    assert snapshot(inline, tmp_path)["accelerate"]["strategy"] == "amp_native:bf16, checkpoint:Block"
    plain, _ = make_master(tmp_path / "j3", workers=1)
    assert "accelerate" not in snapshot(plain, tmp_path)
