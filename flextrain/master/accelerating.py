"""``--accelerate`` in the master: the job's training strategy, chosen once, kept, handed to every worker.

:class:`StrategyChoice` is plain bookkeeping, called under the master's lock. Contract
(docs/accelerate.md, "In jobs"):

* A given strategy (a comma list, or JSON: ``flextrain train`` puts a FILE's there) travels in the
  JobSpec; the workers parse and apply it themselves. The master describes it in status.json.
* ``auto``: a worker asks (``Accelerate`` RPC, before it registers) and the master answers

  - USE with the job's strategy once there is one: the first strategy a search sent in this run, or
    the one an earlier run of the job left in ``<job dir>/accelerate/strategy.json`` (read at start:
    a resumed job, or a relaunched master, never searches again);
  - SEARCH to the asker while no live worker searches: it runs the search on its own records and
    sends its choice, which the master keeps: written (atomically) to ``strategy.json`` — a plain
    strategy file, which ``--accelerate FILE`` and ``auto_accelerate(load_strategy=...)`` read —
    and, with what the search measured, ``search.json``; the answer is USE with the kept strategy;
  - WAIT to the others, who ask again shortly. A searcher that leaves (exits, fails, hangs: the
    master's :meth:`worker_left`) or stays silent past ``--start-timeout`` hands the search to the
    next worker that asks.

So every worker of the job, relaunched, newly joined or resumed, applies the same strategy: their
gradients' dtypes and the all-reduce's buffers agree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flextrain.accelerate import AccelerateError
from flextrain.accelerate.jobs import (
    describe, describe_json, describe_setting, is_json, methods_of_json, parse_setting,
)
from flextrain.accelerate.codec import encode
from flextrain.job import JobSpec
from flextrain.master.checkpoints import write_bytes_atomic
from flextrain.proto import flextrain_pb2 as pb

DIRECTORY = "accelerate"  # under the job directory
STRATEGY_FILE = "strategy.json"
SEARCH_FILE = "search.json"


def strategy_path(spec: JobSpec) -> Path:
    return Path(spec.job_dir) / DIRECTORY / STRATEGY_FILE


class StrategyChoice:
    def __init__(self, spec: JobSpec, *, clock=time.monotonic) -> None:
        self.setting = spec.training.accelerate  # as given (a FILE already read into JSON), or None
        self.auto = spec.training.auto_accelerate
        self.path = strategy_path(spec)
        self.lease = spec.worker.start_timeout  # how long a silent searcher keeps the search
        self.clock = clock
        self.strategy_json: str | None = None  # auto: the job's strategy once chosen
        self.source = ""  # how it was chosen
        self.search: dict | None = None  # what the search measured (its search.json)
        self.searcher: str | None = None  # auto: who searches now
        self.searching_since = 0.0
        self.note = ""  # an event for the job's log, from reading an earlier run's choice
        if self.auto and self.path.is_file():  # an earlier run's choice: resumed, or a relaunched master
            self._read_kept()

    def _read_kept(self) -> None:
        try:
            text = self.path.read_text()
            methods_of_json(text)
        except (OSError, ValueError) as exc:
            self.note = f"{self.path} cannot be read ({exc}): --accelerate auto searches again"
            return
        self.strategy_json = text
        try:
            earlier = json.loads((self.path.parent / SEARCH_FILE).read_text())
        except (OSError, ValueError):
            earlier = None
        self.search = earlier if isinstance(earlier, dict) else None
        by = f", searched by {self.search['worker']}" if self.search and "worker" in self.search else ""
        self.source = f"stored in {self.path}{by}"
        self.note = (f"training strategy: {describe_json(text)} ({self.source}; --accelerate auto, not searching "
                     "again)")

    # ---- the Accelerate RPC -----------------------------------------------------------------
    def ask(self, worker_id: str, proposal: str = "", search_json: str = "") -> tuple[pb.AccelerateResponse, str]:
        """The answer to ``worker_id`` and an event for the job's log ("" for none). ValueError: a
        proposal that is not a JSON strategy."""
        if not self.auto:
            return pb.AccelerateResponse(action=pb.AccelerateResponse.USE, strategy_json="",
                                         source="given (no search: the job's strategy is in its spec)"), ""
        event = ""
        if proposal and self.strategy_json is None:
            methods_of_json(proposal)  # JSON (ValueError otherwise); the workers parse it again
            try:
                search = json.loads(search_json) if search_json else {}
            except ValueError:
                search = {}
            self.search = {**(search if isinstance(search, dict) else {}), "worker": worker_id,
                           "time": round(time.time(), 3)}
            self._keep(proposal)
            self.strategy_json, self.source, self.searcher = proposal, f"searched by {worker_id}", None
            event = (f"training strategy chosen by {worker_id}'s search: {describe_json(proposal)} "
                     f"(--accelerate auto; kept in {self.path})")
        if self.strategy_json is not None:
            return pb.AccelerateResponse(action=pb.AccelerateResponse.USE, strategy_json=self.strategy_json,
                                         source=self.source), event
        now = self.clock()
        if self.searcher in (None, worker_id) or now - self.searching_since > self.lease:
            self.searcher, self.searching_since = worker_id, now
            return (pb.AccelerateResponse(action=pb.AccelerateResponse.SEARCH),
                    f"{worker_id} searches for the job's training strategy (--accelerate auto)")
        return pb.AccelerateResponse(action=pb.AccelerateResponse.WAIT, source=f"{self.searcher} is searching"), ""

    def worker_left(self, worker_id: str) -> None:
        """A worker exited (or failed, or hung): if it was searching, the next to ask searches."""
        if self.searcher == worker_id:
            self.searcher = None

    def _keep(self, proposal: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = json.loads(proposal)
        write_bytes_atomic(self.path, json.dumps(doc, indent=2) + "\n")
        write_bytes_atomic(self.path.parent / SEARCH_FILE, json.dumps(self.search, indent=2) + "\n")

    # ---- status.json ---------------------------------------------------------------------------
    def status(self) -> dict:
        """``{"setting", "strategy", "methods", "source"}`` (auto: also ``file``, ``searcher`` while one
        searches, ``search``: what it measured); ``strategy`` is the methods as the comma list writes them
        (None while auto has not chosen)."""
        if self.setting is None:
            return {}
        out: dict = {"setting": "auto" if self.auto else describe_setting(self.setting)}
        if self.auto:
            text = self.strategy_json
            out.update(strategy=describe_json(text) if text is not None else None, file=str(self.path),
                       source=self.source or (f"{self.searcher} is searching" if self.searcher else "not chosen yet"))
            if self.searcher:
                out["searcher"] = self.searcher
            if self.search is not None:
                out["search"] = self.search
        else:
            text = self.setting if is_json(self.setting) else None
            out.update(strategy=out["setting"], source="given (--accelerate)")
            if text is None:
                try:  # a comma list names classes by name: nothing to import
                    strategy = parse_setting(self.setting)
                except AccelerateError:
                    strategy = None
                if strategy is not None:
                    out.update(strategy=describe(strategy),
                               methods=[{"name": s.name, "config": encode(s.config)} for s in strategy])
        if text is not None:
            out["methods"] = methods_of_json(text)
        return out


__all__ = ["DIRECTORY", "SEARCH_FILE", "STRATEGY_FILE", "StrategyChoice", "strategy_path"]
