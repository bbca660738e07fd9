"""`flextrain plot` refuses what it cannot draw, naming the problem."""

from __future__ import annotations

from ft_helpers import run_flextrain


def test_a_job_without_history_is_named(tmp_path):
    res = run_flextrain("plot", str(tmp_path / "nojob"))
    assert res.returncode == 2 and f"no recorded history for job {str(tmp_path / 'nojob')!r}: " \
        f"{tmp_path / 'nojob' / 'events.jsonl'} does not exist" in res.stderr


def test_an_empty_history_is_named(tmp_path):
    (tmp_path / "events.jsonl").write_text('{"type": "metrics", "ti')  # a torn line only
    res = run_flextrain("plot", str(tmp_path))
    assert res.returncode == 2 and "events.jsonl holds no records" in res.stderr


def test_a_kubernetes_job_says_where_its_history_is_and_how_to_fetch_it():
    res = run_flextrain("plot", "digits", "--namespace", "team-a")
    assert res.returncode == 2
    assert "inside the cluster" in res.stderr and "kubectl cp" in res.stderr
