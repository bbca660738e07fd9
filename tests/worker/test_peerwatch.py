"""The peer watch's bookkeeping in one process (tests/worker/test_collective_teardown.py has the real
deaths): a watch that opens a peer's mark after a quicker watcher saw the peer die and removed it."""

from __future__ import annotations

import json

from flextrain.worker.peerwatch import AliveMark, PeerWatch


def _watch(tmp_path, seen):
    mark = AliveMark(directory=str(tmp_path))
    return mark, PeerWatch(mark, worker_id="worker-0", on_exit=lambda worker, rounds: seen.append((worker, rounds)))


def _peer(mark: AliveMark, tmp_path, **changes) -> dict:
    """A peer's descriptor as it would publish it: another token, its own file beside ours."""
    peer = json.loads(mark.descriptor("worker-2"))
    peer.update(token="f" * 32, path=str(tmp_path / "flextrain-alive-1-ffffffff"), **changes)
    return peer


def test_a_peer_whose_mark_is_gone_from_our_mount_is_reported_exited_with_the_round(tmp_path):
    seen = []
    mark, watch = _watch(tmp_path, seen)
    try:
        watch._watch(_peer(mark, tmp_path), round_id=3)
        assert seen == [("worker-2", frozenset({3}))] and watch.seen_exits == 1
    finally:
        mark.remove()


def test_a_missing_mark_on_another_mount_is_not_taken_for_an_exit(tmp_path):
    seen = []
    mark, watch = _watch(tmp_path, seen)
    try:
        watch._watch(_peer(mark, tmp_path, device=mark.device + 1), round_id=3)  # another /dev/shm: invisible
        watch._watch(_peer(mark, tmp_path, device=None), round_id=4)  # a peer that does not say
        assert seen == [] and watch.seen_exits == 0
    finally:
        mark.remove()
