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


def test_a_suspend_a_resume_and_a_stop_are_marked_as_such():
    from flextrain.cli.plot import draw

    def metrics(t, workers, desired):
        return {"type": "metrics", "time": t, "step": int(t), "loss": 1.0 / t, "samplesPerSecond": 10.0,
                "workers": workers, "desired": desired}

    records = [{"type": "start", "time": 1.0}, metrics(2.0, 2, 2),
               {"type": "scale", "time": 3.0, "desired": 0, "previous": 2}, metrics(4.0, 0, 0),
               {"type": "scale", "time": 5.0, "desired": 2, "previous": 0}, metrics(6.0, 2, 2),
               {"type": "phase", "time": 7.0, "phase": "Failed", "message": "stopped: stopped by user"},
               {"type": "start", "time": 20.0}, metrics(21.0, 2, 2),
               {"type": "phase", "time": 22.0, "phase": "Succeeded", "message": "training finished"}]
    summary = draw(records)
    assert summary.labels == ["suspended", "resumed", "stopped", "master restarted"]  # Succeeded: the end
    assert summary.points["loss"] == 4  # the break at the restart is no point


def test_a_young_job_without_metrics_is_drawn_without_a_warning():
    import warnings

    from flextrain.cli.plot import draw

    records = [{"type": "start", "time": 1.0, "resume": False, "pid": 1},
               {"type": "phase", "time": 1.5, "phase": "Pending", "message": ""}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels found to put in legend"
        summary = draw(records)
    assert summary.points["workers"] == 0 and not summary.markers
