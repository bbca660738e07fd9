"""The chart's side of a job's least privilege (docs/security.md#least-privilege).

The operator creates each job's master Role and binds it (flextrain/k8s/access.py) without RBAC's
``escalate`` or ``bind``: the API server allows that only if the operator holds every right it grants,
in every namespace it does so. NetworkPolicies (``networkPolicies.enabled``, on by default) come with
the operator's ``--network-policies`` and the right to create them; off, neither.
"""

from __future__ import annotations

import pytest
from k8s_static_support import CHART_VALUE_SETS, rendered_objects, rights

from flextrain.k8s.access import master_rules
from flextrain.k8s.meta import owner_reference

VALUE_SETS = pytest.mark.parametrize("values", CHART_VALUE_SETS.values(), ids=CHART_VALUE_SETS.keys())


def operator_rights(objs: list[dict]) -> dict[str, set[str]]:
    (role,) = [o for o in objs if o["kind"] in ("Role", "ClusterRole")
               and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"]
    return rights(role)


def operator_args(objs: list[dict]) -> list[str]:
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


@VALUE_SETS
def test_the_operator_holds_every_right_it_grants_a_master(values):
    held = operator_rights(rendered_objects(values))
    for resource, verbs in rights({"rules": master_rules("job")}).items():
        assert verbs <= held.get(resource, set()), f"the master's Role grants {resource} {verbs}; the operator " \
                                                   f"holds {held.get(resource)}: RBAC would refuse to create it"


@VALUE_SETS
def test_network_policies_are_on_by_default_and_can_be_turned_off(values):
    on = rendered_objects(values)
    assert "--network-policies" in operator_args(on)
    assert operator_rights(on)["networking.k8s.io/networkpolicies"] == {"create"}
    off = rendered_objects({**values, "networkPolicies": {"enabled": False}})
    assert "--network-policies" not in operator_args(off)
    assert "networking.k8s.io/networkpolicies" not in operator_rights(off)


@VALUE_SETS
def test_whoever_sets_block_owner_deletion_may_update_the_jobs_finalizers(values):
    """Operator and master create objects owned by the job with blockOwnerDeletion: true; the
    OwnerReferencesPermissionEnforcement admission plugin (OpenShift's default) refuses such a create (403)
    from a subject that may not update the owner's finalizers."""
    assert owner_reference({"metadata": {"name": "job", "uid": "u"}})["blockOwnerDeletion"] is True
    finalizers = "flextrain.dev/elasticjobs/finalizers"
    assert "update" in operator_rights(rendered_objects(values)).get(finalizers, set())
    assert "update" in rights({"rules": master_rules("job")}).get(finalizers, set())
