"""Where a job's parameter servers listen in their pods and what their Services expose (no cluster needed)."""

from __future__ import annotations

import pytest

from flextrain.k8s import meta
from flextrain.k8s.pods import instance_pod, ps_port, ps_service


def job(annotations=None) -> dict:
    return {"apiVersion": meta.API_VERSION, "kind": meta.KIND,
            "metadata": {"name": "ctr", "namespace": "default", "uid": "u-1", "annotations": annotations or {}},
            "spec": {"image": "flextrain:test", "modelDef": "m.py:Model", "data": {"training": "d"}}}


def test_every_ps_listens_on_the_ps_port_in_its_own_pod_by_default():
    assert [ps_port(job(), i) for i in range(3)] == [meta.PS_PORT] * 3
    svc = ps_service(job(), index=1)
    assert svc["metadata"]["name"] == "ctr-ps-1"
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(meta.PS_PORT, meta.PS_PORT)]


def test_the_port_base_annotation_gives_each_ps_its_own_port_in_pod_and_service():
    j = job({meta.ANNOTATION_PS_PORT_BASE: "41000"})
    assert [ps_port(j, i) for i in range(3)] == [41000, 41001, 41002]
    pod = instance_pod(j, role="ps", index=2, instance_id="ps-2", args=("ps",), env={}, master_address="m:1")
    assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 41002
    assert ps_service(j, index=2)["spec"]["ports"][0]["port"] == 41002


@pytest.mark.parametrize("raw", ["http", "0", "65535"])
def test_a_bad_port_base_is_named(raw):
    with pytest.raises(ValueError, match=rf"ps-port-base\]: not a port number for parameter server 1: '{raw}'"):
        ps_port(job({meta.ANNOTATION_PS_PORT_BASE: raw}), 1)
