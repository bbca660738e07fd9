"""The user's commands: kubectl apply / get / scale / describe against the emulated cluster and the operator.

What the emulator cannot show: the CRD's printer columns (Phase, Workers,
Progress) -- it serves no server-side Table, so ``kubectl get ej`` prints
NAME and AGE only; the columns' jsonPaths are checked statically in
tests/k8s_static.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ft_helpers import wait_for

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")]

EXAMPLE = Path(__file__).resolve().parents[3] / "manifests" / "examples" / "digits-allreduce.yaml"


@pytest.fixture
def kubectl(k8s_cluster):
    def run(*args: str) -> str:
        res = subprocess.run(["kubectl", "--kubeconfig", str(k8s_cluster.kubeconfig), *args],
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
        return res.stdout
    return run


def test_apply_get_scale_describe_an_example(operator, jobs, kubectl):
    assert "elasticjob.flextrain.dev/digits created" in kubectl("apply", "-f", str(EXAMPLE), "--validate=false")
    wait_for(lambda: 0 in jobs.master_pods("digits"), timeout=30, what="the operator's master pod")
    header, row = kubectl("get", "ej").splitlines()
    assert header.split() == ["NAME", "AGE"] and row.split()[0] == "digits"
    assert kubectl("get", "ej", "digits", "-o", "jsonpath={.status.phase}") == "Pending"

    assert "elasticjob.flextrain.dev/digits scaled" in kubectl("scale", "ej/digits", "--replicas=3")
    assert kubectl("get", "ej", "digits", "-o", "jsonpath={.spec.replicaSpecs.worker.replicas}") == "3"

    out = wait_for(lambda: "MasterCreated" in (o := kubectl("describe", "ej/digits")) and o, timeout=30,
                   what="the operator's events in kubectl describe")
    assert "created master pod digits-master-0 and service digits-master" in out
    pods = kubectl("get", "pods", "-l", "flextrain.dev/job=digits", "-o", "name")
    assert pods.split() == ["pod/digits-master-0"]
