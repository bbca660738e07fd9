"""Evaluation and prediction of a ParameterServer job's model: its shards exported to one checkpoint.

``--checkpoint PS_JOB_DIR`` (``spec.checkpoint`` in a pod) names a job whose
model is kept by its parameter servers (``ps-checkpoints/``). Before the
checks, the shards are read (``flextrain/ps/export.py``) into
``JOB_DIR/ps-model.ckpt`` of the new job, which its workers then load as any
checkpoint; a failed check removes it again.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

PS_MODEL = "ps-model.ckpt"
PS_STATE = "ps-checkpoints"


def ps_state_dir(value: str) -> Path | None:
    """The ``ps-checkpoints/`` of a job directory whose model is on parameter servers (and which has no
    checkpoint of its own), or ``value`` itself when it is such a directory (a PS job's finalCheckpoint)."""
    path = Path(value)
    if not path.is_dir():
        return None
    if path.name == PS_STATE and any(path.glob("ps-[0-9]*")):
        return path
    if (path / PS_STATE).is_dir() and not (path / "checkpoints" / "latest.json").exists() \
            and not (path / "checkpoints" / "final.ckpt").exists():
        return path / PS_STATE
    return None


def is_ps_job_dir(value: str) -> bool:
    return ps_state_dir(value) is not None


def export_ps_model(spec, dest: Path, *, field: str) -> None:
    """Write the model of the PS job ``spec.checkpoint`` names to ``dest`` as a flextrain checkpoint.
    JobSpecError naming ``field`` when the shards and the module's model do not agree."""
    from flextrain.elastic.statecodec import encode
    from flextrain.job import JobSpecError
    from flextrain.ps.export import ExportError, export_model
    from flextrain.worker.checkpoints import write_checkpoint
    from flextrain.worker.module import Framework, load_model_def

    model_def = load_model_def(spec.model_def)
    if model_def.framework is not Framework.PYTORCH:
        raise JobSpecError(f"{field} {spec.checkpoint}: a ParameterServer job of a Keras model, which evaluate and "
                           "predict cannot read yet; evaluate it in training instead (--validation-data, "
                           "--evaluation-steps: its final evaluation runs on the final model)")
    try:
        state, version = export_model(model_def.build_model(), ps_state_dir(spec.checkpoint))
    except ExportError as exc:
        raise JobSpecError(f"{field} {spec.checkpoint}: {exc}") from None
    write_checkpoint(dest, encode({"model": state, "version": version}))


@contextmanager
def ps_model_checkpoint(spec, *, field: str = "--checkpoint"):
    """``spec`` as it is, or (its checkpoint a ParameterServer job's directory) with that job's model
    exported to ``JOB_DIR/ps-model.ckpt``; removed again, and the job directory if this made it, when
    the block raises (a refused job leaves nothing behind)."""
    if not is_ps_job_dir(spec.checkpoint):
        yield spec
        return
    job_dir = Path(spec.job_dir)
    made = not job_dir.exists()
    dest = job_dir / PS_MODEL
    try:
        export_ps_model(spec, dest, field=field)
        yield spec.replace(checkpoint=str(dest))
    except BaseException:
        dest.unlink(missing_ok=True)
        if made:
            shutil.rmtree(job_dir, ignore_errors=True)
        raise


__all__ = ["PS_MODEL", "export_ps_model", "is_ps_job_dir", "ps_model_checkpoint", "ps_state_dir"]
