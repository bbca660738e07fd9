"""Where a job's checkpoints are, and the ledger state that goes with each.

A round's rank 0 writes model + optimizer state (``ckpt-<version>.ckpt``,
``final.ckpt``); the master, told the exact position the state corresponds
to, writes the matching ledger snapshot (``ledger-<version>.json``) and then
``latest.json`` naming both. Resuming reads ``latest.json``: model state and
data position come from the same instant, so every record is applied once.
Older pairs are pruned, keeping the newest ``keep``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path



def write_json_atomic(path: Path, data: dict) -> None:
    """Write JSON so that readers see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class CheckpointStore:
    def __init__(self, directory: Path, *, keep: int = 2) -> None:
        self.directory = Path(directory)
        self.keep = keep

    @property
    def latest_path(self) -> Path:
        return self.directory / "latest.json"

    def record(self, *, checkpoint: str, version: int, ledger: dict, final: bool) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        ledger_path = self.directory / f"ledger-{version:09d}.json"
        write_json_atomic(ledger_path, ledger)
        write_json_atomic(self.latest_path, {
            "checkpoint": checkpoint, "ledger": str(ledger_path), "version": version, "final": final,
        })
        self._prune()

    def latest(self) -> dict | None:
        """``{"checkpoint", "version", "final", "ledger": <state dict>}`` or None."""
        try:
            meta = json.loads(self.latest_path.read_text())
        except FileNotFoundError:
            return None
        return {**meta, "ledger": json.loads(Path(meta["ledger"]).read_text())}

    def _prune(self) -> None:
        for pattern in ("ckpt-*.ckpt", "ledger-*.json"):
            for old in sorted(self.directory.glob(pattern))[: -self.keep]:
                old.unlink(missing_ok=True)
