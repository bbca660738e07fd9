"""Checkpoints as the workers report them: periodic, final, stop and in-memory snapshot marks.

A mixin of :class:`flextrain.master.coordinator.JobMaster` (as
:class:`flextrain.master.rounds.RoundKeeping` is): these methods use its lock,
phase, ledger, rendezvous and checkpoint store (``checkpoints``, ``flash``,
``recorded_version``), and its ``finish``/``note``/``check_outcome``.
"""

from __future__ import annotations

import json

from flextrain.master.accounting import ledger_at, moved_past
from flextrain.master.checkpoints import StateWriteError
from flextrain.master.phase import Phase
from flextrain.proto import flextrain_pb2 as pb


class CheckpointReports:
    def kept_checkpoint(self) -> str:
        """``"; the last good checkpoint is kept: PATH (step N)"``, or "" without one: how a message
        about a failed write says what a resume continues from."""
        latest = self.checkpoints.latest() if self.checkpoints else None
        return f"; the last good checkpoint is kept: {latest['checkpoint']} (step {latest['version']})" if latest else ""

    def flush_flash(self, *, why: str = "every worker of the last round was lost") -> int | None:
        """Persist the newest in-memory snapshot when it is newer than the newest checkpoint (``why``:
        every worker lost, a resume, the job's end); the snapshots are cleared after, as the model goes
        back to that checkpoint. Returns the version persisted, or None."""
        if self.flash is None:
            return None
        try:
            version = self.checkpoints.adopt_flash(self.flash, note=self.note)
        except OSError as exc:  # StateWriteError (a full disk) names the file; the older checkpoint stays
            self.note(f"the newest in-memory checkpoint could not be persisted: {exc}")
            version = None
        if version is not None:
            self.recorded_version = max(self.recorded_version, version)
            self.note(f"in-memory checkpoint of step {version} persisted ({why})")
        self.flash.clear()
        return version

    def report_checkpoint(self, req: pb.ReportCheckpointRequest) -> pb.ReportCheckpointResponse:
        if req.memory:
            return pb.ReportCheckpointResponse(ledger_json=self.mark_snapshot(req))
        if not (req.final or req.stop):
            return self._record_periodic(req)
        with self.cond:
            self._touch(req.worker_id, req.position)
            if req.ledger_json and (self.checkpoints is None or self.over
                                    or req.position.version <= self.recorded_version):
                return pb.ReportCheckpointResponse()  # a persisted snapshot overtaken by a newer checkpoint
            if self.checkpoints is not None:
                try:
                    ledger = (json.loads(req.ledger_json) if req.ledger_json
                              else ledger_at(self.ledger, self.rendezvous.current, req.position))
                    self.checkpoints.record(checkpoint=req.path, version=req.position.version,
                                            ledger=ledger, final=req.final)
                    self.recorded_version = max(self.recorded_version, req.position.version)
                except StateWriteError as exc:  # e.g. a full disk: the previous checkpoint stays the latest
                    self._checkpoint_not_recorded(req, exc)
                    return pb.ReportCheckpointResponse()
            if req.final:
                self.final_checkpoint = req.path
            if req.stop and self.suspension is not None:
                self.note(f"suspend checkpoint at step {req.position.version}: {req.path}")
            elif req.stop and self.stopping:
                self.finish(Phase.FAILED, f"stopped: {self.stopping}; checkpoint at step "
                            f"{req.position.version}: resume with `flextrain train --resume {self.spec.job_dir}`")
            self.check_outcome()
            self.cond.notify_all()
        return pb.ReportCheckpointResponse()

    def _record_periodic(self, req: pb.ReportCheckpointRequest) -> pb.ReportCheckpointResponse:
        """A periodic checkpoint (``--checkpoint-steps``, a persisted in-memory snapshot). Its ledger is
        taken under the job's lock, at the reported position; its two fsync'd files are written outside
        it: every worker's heartbeats and task calls would otherwise wait on the disk (the asyncio
        server serves them inline). The store keeps writers in order; a persisted snapshot (it carries
        its ledger) older than a recorded checkpoint is not recorded."""
        snapshot = bool(req.ledger_json)
        with self.cond:
            self._touch(req.worker_id, req.position)
            if self.checkpoints is None or (snapshot and (self.over or req.position.version <= self.recorded_version)):
                return pb.ReportCheckpointResponse()
            ledger = (json.loads(req.ledger_json) if snapshot
                      else ledger_at(self.ledger, self.rendezvous.current, req.position))
        try:
            recorded = self.checkpoints.record(checkpoint=req.path, version=req.position.version, ledger=ledger,
                                               final=False, newer_only=snapshot)
        except StateWriteError as exc:  # e.g. a full disk: the previous checkpoint stays the latest
            with self.cond:
                self._checkpoint_not_recorded(req, exc)
            return pb.ReportCheckpointResponse()
        with self.cond:
            if recorded:
                self.recorded_version = max(self.recorded_version, req.position.version)
            self.check_outcome()
            self.cond.notify_all()
        return pb.ReportCheckpointResponse()

    def _checkpoint_not_recorded(self, req: pb.ReportCheckpointRequest, exc: StateWriteError) -> None:
        """A checkpoint's files could not be written: the job fails naming the file and the reason, and
        the last good checkpoint (caller holds the lock)."""
        self.finish(Phase.FAILED, f"cannot record the checkpoint of step {req.position.version}: "
                    f"{exc}{self.kept_checkpoint()}")
        self.cond.notify_all()

    def mark_snapshot(self, req: pb.ReportCheckpointRequest) -> str:
        """The ledger state (JSON) of a model that committed exactly up to ``req.position``: what an
        in-memory snapshot taken there is persisted with; "" when the master can no longer tell.

        Rank 0 does not wait for this answer (worker/flash.py: its writer thread does), so the round
        may have gone on meanwhile. Inside the snapshot's round the answer is exact while the ledger
        holds no outcome the snapshot's model lacks (``moved_past``: its task completed or failed at
        another step, a later task done or failed with steps applied). After a round change it is exact
        while nothing beyond the snapshot's step was committed (the new round starts at its version)."""
        with self.cond:
            pos = req.position
            info = self.workers.get(req.worker_id)
            if info is not None and (info.position.round_id, info.position.version) > (pos.round_id, pos.version):
                info.last_seen = self.clock()  # a late mark: the worker's newer position stays
            else:
                self._touch(req.worker_id, pos)
            rnd = self.rendezvous.current
            if self.checkpoints is None or self.over or rnd is None:
                return ""
            if rnd.round_id == pos.round_id:
                if moved_past(self.ledger, rnd, pos):
                    return ""
            elif rnd.version != pos.version or any(
                    w.position.round_id == rnd.round_id and w.position.version > pos.version
                    for w in self.workers.values()):
                return ""
            return json.dumps(ledger_at(self.ledger, rnd, pos))
