"""``flextrain plot JOB [--out job.png]``: a picture of a job's life from its recorded history.

Drawn from ``<job-dir>/events.jsonl`` (flextrain/master/history.py) with
matplotlib, headless (Agg): training loss and evaluation metrics, samples/s,
and workers (active and desired) over one shared time axis, with every
failure (a kill, a crash, a hang), join, relaunch, scale, suspend and resume,
stop or failure of the job and master restart marked as a vertical line across
all panels and labelled on the top one; the lines break where a master restarted.

A Kubernetes job's history is in its job directory inside the cluster: the
command says so and how to copy it out, rather than plotting nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from flextrain.cli.common import CLIError, HelpFormatter, job_file_candidates, none_exist

# How each marked record is drawn: (colour, line style, label of the record)
MARKS = {
    "failure": ("tab:red", "-", lambda r: f"{r['worker']} {r['why']}"),
    "relaunch": ("tab:orange", "--", lambda r: f"relaunch {r['worker']}"),
    "join": ("tab:green", ":", lambda r: f"{r['worker']} joined"),
    "leave": ("tab:gray", ":", lambda r: f"{r['worker']} left ({r['why']})"),
    # desired 0 is a suspend (a scale never goes below --min-workers >= 1), and from 0 its resume
    "scale": ("tab:blue", "-.", lambda r: "suspended" if r["desired"] == 0 else "resumed" if r["previous"] == 0
              else f"scale {r['previous']}→{r['desired']}"),
    "start": ("tab:purple", "--", lambda r: "master restarted"),
    # only a Failed phase is marked (a stop ends so too): the other phases are the plot's own start and end
    "phase": ("tab:red", "--", lambda r: "stopped" if str(r.get("message", "")).startswith("stopped") else "failed"),
}


@dataclass
class PlotSummary:
    """What :func:`draw` drew: metric points per series and markers per record type."""

    points: dict[str, int] = field(default_factory=dict)  # "loss", "samples/s", "workers", "eval/<name>"
    markers: Counter = field(default_factory=Counter)  # "failure", "join", "relaunch", ...
    labels: list[str] = field(default_factory=list)  # the markers' labels, in time order


def add_commands(sub) -> None:
    p = sub.add_parser("plot", help="draw a job's loss, evaluations, samples/s and workers over time, with every "
                                    "kill, join and relaunch marked (from JOBDIR/events.jsonl)",
                       formatter_class=HelpFormatter)
    p.add_argument("job", metavar="JOB", help="job name or job directory (or an events.jsonl file)")
    p.add_argument("--out", metavar="PNG", help="where to write the picture (default: JOBDIR/job.png)")
    p.add_argument("--namespace", help="the job is an ElasticJob in this namespace")
    p.add_argument("--backend", choices=("local", "kubernetes"), help="kubernetes: the job is an ElasticJob")
    p.set_defaults(fn=cmd_plot)


def events_path(job: str) -> Path:
    """The events.jsonl of a local job given as a directory, a name under ./flextrain-jobs, or the file."""
    from flextrain.master.history import EVENTS_FILE

    path = Path(job)
    if path.is_file():
        return path
    candidates = job_file_candidates(job, EVENTS_FILE)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise CLIError(f"no recorded history for job {job!r}: {none_exist(candidates)} (a job records it from this "
                   "version on)")


def cmd_plot(args) -> int:
    from flextrain.master.history import read_events

    if args.backend == "kubernetes" or args.namespace:
        raise CLIError(f"the history of ElasticJob {args.job} is in its job directory inside the cluster, not "
                       f"reachable from here: copy it out (kubectl cp <master-pod>:<jobDir>/events.jsonl "
                       f"{args.job}-events.jsonl) and run `flextrain plot {args.job}-events.jsonl`")
    path = events_path(args.job)
    records = read_events(path)
    if not records:
        raise CLIError(f"{path} holds no records")
    out = Path(args.out) if args.out else path.parent / "job.png"
    summary = draw(records, out=out)
    marks = ", ".join(f"{n} {kind}" for kind, n in sorted(summary.markers.items())) or "no events"
    print(f"{out}: {summary.points.get('loss', 0)} loss points, {marks}")
    return 0


def draw(records: list[dict], *, out: Path | None = None, title: str | None = None) -> PlotSummary:
    """Draw ``records`` (read_events) and write the PNG to ``out`` (None: draw only); returns what was drawn."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display is needed or used
    import matplotlib.pyplot as plt

    t0 = records[0]["time"]
    summary = PlotSummary()
    metrics = [r for r in records if r["type"] == "metrics"]
    fig, (ax_loss, ax_rate, ax_workers) = plt.subplots(3, 1, sharex=True, figsize=(10, 7),
                                                       gridspec_kw={"height_ratios": [2, 1, 1]})

    # a master's start after the first (a resume): the lines break there, not bridging the time between runs
    breaks = [r["time"] - t0 for r in records if r["type"] == "start"][1:]

    def series(ax, key: str, name: str, **style) -> None:
        pts = [(r["time"] - t0, r[key]) for r in metrics if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*sorted(pts + [(x, float("nan")) for x in breaks])), **style, label=name)
        summary.points[name] = len(pts)

    series(ax_loss, "loss", "loss", color="black", lw=1.2)
    ax_loss.set_ylabel("training loss")
    if summary.points["loss"] and all(r["loss"] > 0 for r in metrics if r.get("loss") is not None):
        ax_loss.set_yscale("log")  # a loss falls by orders of magnitude: a linear axis shows a flat line
    evaluations = [r for r in records if r["type"] == "evaluation"]
    names = sorted({n for r in evaluations for n, v in r["metrics"].items() if v is not None})
    if names:
        ax_eval = ax_loss.twinx()
        for name in names:
            pts = [(r["time"] - t0, r["metrics"][name]) for r in evaluations if r["metrics"].get(name) is not None]
            ax_eval.plot(*zip(*pts), "o-", ms=4, lw=1, label=f"eval {name}")
            summary.points[f"eval/{name}"] = len(pts)
        ax_eval.set_ylabel("evaluation")
        ax_eval.legend(loc="upper right", fontsize=8)
    series(ax_rate, "samplesPerSecond", "samples/s", color="tab:cyan")
    ax_rate.set_ylabel("samples/s")
    series(ax_workers, "workers", "workers", color="tab:green", drawstyle="steps-post")
    series(ax_workers, "desired", "desired", color="tab:blue", ls="--", drawstyle="steps-post")
    ax_workers.set_ylabel("workers")
    if summary.points["workers"] or summary.points["desired"]:  # a young job has none: no empty legend (a warning)
        ax_workers.legend(loc="upper right", fontsize=8)
    ax_workers.set_xlabel("seconds since the job started")

    failed = {r["worker"] for r in records if r["type"] == "failure"}
    span = max(r["time"] for r in records) - t0 or 1.0
    labelled: list[float] = []  # x of the labels drawn: close ones are staggered down, not overprinted
    starts = 0
    for rec in records:
        kind = rec["type"]
        if kind == "start":
            starts += 1
            if starts == 1:
                continue  # the first master's start is the time axis' origin
        elif ((kind == "join" and rec.get("why") == "start") or kind not in MARKS
              or (kind == "leave" and rec["worker"] in failed)  # a failed worker's leave: its failure is marked
              or (kind == "phase" and rec.get("phase") != "Failed")):
            continue
        colour, style, label = MARKS[kind]
        x = rec["time"] - t0
        for ax in (ax_loss, ax_rate, ax_workers):
            ax.axvline(x, color=colour, ls=style, lw=1, alpha=0.8)
        level = sum(1 for seen in labelled if abs(seen - x) < 0.03 * span)
        labelled.append(x)
        summary.labels.append(label(rec))
        ax_loss.annotate(label(rec), (x, 1.0 - 0.33 * (level % 3)), xycoords=("data", "axes fraction"), rotation=90,
                         va="top", ha="right", fontsize=7, color=colour)
        summary.markers[kind] += 1
    ax_loss.set_title(title or "job history: loss, evaluations, samples/s and workers over time")
    fig.tight_layout()
    if out is not None:
        fig.savefig(out, dpi=80)
    plt.close(fig)
    return summary


__all__ = ["MARKS", "PlotSummary", "add_commands", "cmd_plot", "draw", "events_path"]
