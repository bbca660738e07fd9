"""--ps-wal / --no-ps-wal (JobSpec ps_wal, ElasticJob spec.replicaSpecs.ps.psWal): the PS write-ahead log switch.

With the log (the default, tested in test_ps_job.py) a SIGKILLed PS comes back
exactly where it was. Without it, it comes back from its last checkpoint and
the updates since are lost: shown here with the model that counts, on the PS,
how often each record was applied (tests/e2e/zoo/counting_ps.py).
"""

from __future__ import annotations

import re

import pytest
from test_ps_job import ps_counts, run_killing_ps_1_in_the_second_epoch

from flextrain.cli import build_spec, make_parser
from flextrain.job import Strategy
from flextrain.k8s.resource import jobspec_from_resource, resource_from_jobspec


def _spec(*extra: str):
    args = make_parser().parse_args(["train", "--model-def", "m.py:Model", "--training-data", "d", "--job-dir", "j",
                                      "--distribution-strategy", "ParameterServer", "--ps", "2", *extra])
    return build_spec(args)


def test_the_switch_is_one_name_on_the_command_line_in_jobspec_and_in_the_elasticjob():
    assert _spec().ps.ps_wal is True
    spec = _spec("--no-ps-wal")
    assert spec.ps.ps_wal is False and spec.strategy is Strategy.PARAMETER_SERVER
    resource = resource_from_jobspec(spec, image="flextrain:test", namespace="default")
    assert resource["spec"]["replicaSpecs"]["ps"]["psWal"] is False
    assert jobspec_from_resource(resource).ps.ps_wal is False
    del resource["spec"]["replicaSpecs"]["ps"]["psWal"]  # omitted: the default, on
    assert jobspec_from_resource(resource).ps.ps_wal is True


@pytest.mark.e2e
def test_without_the_log_a_killed_ps_loses_the_updates_since_its_checkpoint(digits_data, tmp_path):
    from flextrain.protocol.shard import row_owners

    # no PS checkpoint while the job runs: the relaunched ps-1 starts from nothing
    # the master's ledger counts every record (it does not know what the PS lost)
    job_dir = run_killing_ps_1_in_the_second_epoch(digits_data, tmp_path, "--no-ps-wal", "--ps-checkpoint-steps", "0")
    assert not list((job_dir / "ps-checkpoints").rglob("wal-*.log")), "a PS wrote a log despite --no-ps-wal"
    starts = re.findall(r"PS 1/2 listening on \S+ \(version (\d+)", (job_dir / "logs" / "ps-1.log").read_text())
    assert [int(v) for v in starts] == [0, 0]  # relaunched with nothing to restore
    import numpy as np

    _, rows = ps_counts(job_dir, 1408)
    owners = row_owners(np.arange(1408), 2)
    on_ps0, on_ps1 = rows[owners == 0], rows[owners == 1]
    assert on_ps0.tolist() == [3.0] * len(on_ps0)  # ps-0 kept everything
    assert on_ps1.max() <= 2.0  # ps-1 lost at least the first epoch of every row it holds
