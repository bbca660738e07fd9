"""The Helm chart renders, lints and validates offline, and grants least privilege.

helm-python-sdk binds Helm's Go SDK (no helm binary, no cluster); every rendered
object is validated strictly (unknown fields are errors) against the Kubernetes
OpenAPI schemas of the oldest supported and the newest known Kubernetes.
"""

from __future__ import annotations

import re
import shutil

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from flextrain.k8s import meta
from k8s_static_support import (
    CHART_DIR,
    CHART_VALUE_SETS,
    kube_versions,
    render_chart,
    rendered_objects,
    rights,
)

# The shared value sets, plus a list of watched namespaces (not the release namespace) and a private registry.
WATCH_LIST = {"watchNamespaces": ["team-a", "team-b"], "imagePullSecrets": [{"name": "regcred"}],
              "jobServiceAccount": {"extraNamespaces": ["team-b"]}}
ALL_VALUE_SETS = {**CHART_VALUE_SETS, "watch-list": WATCH_LIST}
VALUE_SETS = pytest.mark.parametrize("values", ALL_VALUE_SETS.values(), ids=ALL_VALUE_SETS.keys())
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate", "deletecollection"}
NAMESPACE = "ml-team"
OPERATOR = "flextrain-operator"  # "flextrain.operatorName" for the release flextrain


def objects_of(kind: str, objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def operator_container(objs: list[dict]) -> dict:
    (deployment,) = objects_of("Deployment", objs)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def watched_namespaces(values: dict) -> list[str]:
    """What the operator should watch: [] for all namespaces, else watchNamespaces or the release namespace."""
    return [] if values.get("watchAllNamespaces") else values.get("watchNamespaces") or [NAMESPACE]


def job_namespaces(values: dict) -> set[str]:
    """Where the job ServiceAccount belongs: the watched namespaces (all: the release's plus extraNamespaces)."""
    if values.get("watchAllNamespaces"):
        return {NAMESPACE, *values.get("jobServiceAccount", {}).get("extraNamespaces", [])}
    return set(watched_namespaces(values))


def job_service_accounts(objs: list[dict]) -> list[dict]:
    return [o for o in objects_of("ServiceAccount", objs) if o["metadata"]["name"] == "flextrain-job"]


@VALUE_SETS
def test_chart_lints_clean(values):
    report = helm.lint(str(CHART_DIR), values, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert report["errors"] == [] and problems == [], report


def test_lint_reports_a_broken_template(tmp_path):
    """The lint check is not vacuous: a template with a syntax error fails it."""
    chart = tmp_path / "flextrain"
    shutil.copytree(CHART_DIR, chart)
    (chart / "templates" / "broken.yaml").write_text("kind: ConfigMap\nmetadata:\n  name: {{ .Values.nope.missing }\n")
    report = helm.lint(str(chart), {}, strict=True)
    assert report["errors"], report


def test_values_schema_rejects_a_non_boolean_watch_all_namespaces():
    with pytest.raises(helm.HelmValuesError, match="watchAllNamespaces"):
        render_chart({"watchAllNamespaces": "yes"})


def test_values_schema_rejects_a_second_operator_replica():
    with pytest.raises(helm.HelmValuesError, match="replicas"):
        render_chart({"operator": {"replicas": 2}})


@VALUE_SETS
def test_every_rendered_object_validates_strictly(values):
    objs = rendered_objects(values, namespace=NAMESPACE)
    assert objs
    for version in kube_versions():
        for obj in objs:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:  # name the object, not just the schema path
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: {e}")


@VALUE_SETS
def test_namespaced_objects_go_to_their_namespace(values):
    """Nothing is hard-wired to `default`: objects land in the release namespace (or the watched/job namespaces)."""
    for obj in rendered_objects(values, namespace=NAMESPACE):
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            assert "namespace" not in obj["metadata"]
        elif obj["metadata"]["name"] == "flextrain-job":
            assert obj["metadata"]["namespace"] in job_namespaces(values)
        elif obj["kind"] in ("Role", "RoleBinding"):
            assert obj["metadata"]["namespace"] in watched_namespaces(values), obj["metadata"]
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]


def test_operator_watches_only_its_namespace_by_default():
    objs = rendered_objects({}, namespace=NAMESPACE)
    assert operator_container(objs)["args"][:-3] == ["operator", "--namespace", NAMESPACE]
    assert objects_of("ClusterRole", objs) == [] and objects_of("ClusterRoleBinding", objs) == []
    assert len(objects_of("Role", objs)) == 1  # the operator's (job pods have none: flextrain.k8s.access)


def test_operator_watches_all_namespaces_with_a_cluster_role():
    objs = rendered_objects(CHART_VALUE_SETS["all-namespaces"], namespace=NAMESPACE)
    assert operator_container(objs)["args"][:-3] == ["operator", "--all-namespaces"]
    (cluster_role,) = objects_of("ClusterRole", objs)
    (binding,) = objects_of("ClusterRoleBinding", objs)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": cluster_role["metadata"]["name"]}
    (sa,) = [o for o in objects_of("ServiceAccount", objs) if o["metadata"]["name"] != "flextrain-job"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    # The operator's rights are granted once, cluster-wide; no namespaced copy lingers.
    assert objects_of("Role", objs) == []


@VALUE_SETS
def test_rbac_is_least_privilege(values):
    for role in objects_of("Role", rendered_objects(values)) + objects_of("ClusterRole", rendered_objects(values)):
        for rule in role["rules"]:
            where = f"{role['kind']}/{role['metadata']['name']} {rule}"
            assert "*" not in rule["apiGroups"] and "*" not in rule["resources"], where
            assert not FORBIDDEN_VERBS & set(rule["verbs"]), where
            assert "nonResourceURLs" not in rule and "resourceNames" not in rule, where
            # Nothing flextrain does needs cluster-wide RBAC or other workloads; secrets only the operator's
            # own (spec.tls: each job's <job>-tls), by name, never listed or watched.
            assert not {"clusterroles", "clusterrolebindings", "deployments", "nodes",
                        "customresourcedefinitions"} & set(rule["resources"]), where
            if "secrets" in rule["resources"]:
                assert role["metadata"]["name"] != "flextrain-job", where
                assert rule["resources"] == ["secrets"] and set(rule["verbs"]) <= {"get", "create", "delete"}, where
            # A job master's identity (flextrain.k8s.access) and NetworkPolicies: made, never changed.
            if {"serviceaccounts", "roles", "rolebindings", "networkpolicies"} & set(rule["resources"]):
                assert set(rule["verbs"]) <= {"create", "get"}, where
                assert set(rule["verbs"]) == {"create"} or rule["resources"] == ["serviceaccounts"], where
            if rule["apiGroups"] == ["scheduling.volcano.sh"]:  # gang volcano: the job's PodGroup, nothing else
                assert rule["resources"] == ["podgroups"], where
                continue
            assert set(rule["apiGroups"]) <= {"", "flextrain.dev", "rbac.authorization.k8s.io",
                                              "networking.k8s.io"}, where


@VALUE_SETS
def test_job_service_account_mounts_no_token_and_has_no_rights(values):
    """Workers and PS run as flextrain-job and never call the API; each master runs as its job's own account."""
    objs = rendered_objects(values, namespace=NAMESPACE)
    accounts = job_service_accounts(objs)
    assert {a["metadata"]["namespace"] for a in accounts} == job_namespaces(values)
    assert all(a["automountServiceAccountToken"] is False for a in accounts)
    assert not [o for o in objs if o["kind"] in ("Role", "RoleBinding") and o["metadata"]["name"] == "flextrain-job"]


def test_operator_rights_are_what_it_calls_and_no_more():
    """flextrain/operator deletes only what a job's lifecycle says (activeDeadlineSeconds: its pods;
    ttlSecondsAfterFinished: its pods, Services, TLS Secret and PodGroup); relaunched masters are new pods; each
    job's master identity and NetworkPolicies are created once and collected with the job."""
    (role,) = [r for r in objects_of("Role", rendered_objects({})) if r["metadata"]["name"] != "flextrain-job"]
    assert rights(role) == {
        "flextrain.dev/elasticjobs": {"get", "list", "watch", "patch"},
        "flextrain.dev/elasticjobs/status": {"patch"},
        "flextrain.dev/elasticjobs/finalizers": {"update"},  # blockOwnerDeletion on what it creates
        "pods": {"get", "list", "watch", "create", "delete", "patch"},  # patch: held to grant it (access.py)
        "services": {"get", "list", "create", "delete"},
        "secrets": {"get", "create", "delete"},  # spec.tls: each job's <job>-tls
        "scheduling.volcano.sh/podgroups": {"get", "create", "delete"},
        "events": {"create"},
        "serviceaccounts": {"get", "create"},  # get: flextrain-job's imagePullSecrets
        "rbac.authorization.k8s.io/roles": {"create"},
        "rbac.authorization.k8s.io/rolebindings": {"create"},
        "networking.k8s.io/networkpolicies": {"create"},  # networkPolicies.enabled (default)
    }


def test_job_service_account_can_be_left_out():
    objs = rendered_objects({"jobServiceAccount": {"create": False}})
    assert not [o for o in objs if o["metadata"]["name"] == "flextrain-job"]


def test_operator_pod_runs_unprivileged_as_one_replica():
    objs = rendered_objects({})
    (deployment,) = objects_of("Deployment", objs)
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    container = operator_container(objs)
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert container["image"] == f"flextrain:{chart['appVersion']}"
    (operator_sa,) = [o for o in objects_of("ServiceAccount", objs) if o["metadata"]["name"] != "flextrain-job"]
    assert pod["serviceAccountName"] == operator_sa["metadata"]["name"]


def test_image_and_resources_come_from_values():
    objs = rendered_objects({"image": {"repository": "reg.example/ft", "tag": "v9", "pullPolicy": "Always"},
                             "operator": {"resources": {"limits": {"memory": "1Gi"}}}})
    container = operator_container(objs)
    assert (container["image"], container["imagePullPolicy"]) == ("reg.example/ft:v9", "Always")
    # Helm merges maps: the override replaces the limit, the default requests stay.
    assert container["resources"] == {"limits": {"memory": "1Gi"}, "requests": {"cpu": "50m", "memory": "128Mi"}}


def test_values_yaml_is_documented_line_by_line():
    """Every key in values.yaml has a comment right above it (the maps under `resources` excepted)."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    inside_resources = None
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w.-]*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        if inside_resources is not None and indent > inside_resources:
            continue
        inside_resources = indent if m.group(2) == "resources" else None
        assert i > 0 and lines[i - 1].strip().startswith("#"), f"values.yaml line {i + 1}: {m.group(2)!r} undocumented"


@VALUE_SETS
def test_notes_tell_how_to_submit_and_watch_a_job(values):
    notes = render_chart(values, namespace=NAMESPACE)["NOTES.txt"]
    job_ns = (watched_namespaces(values) or [NAMESPACE])[0]  # a namespace jobs can go to
    for command in (f"kubectl -n {NAMESPACE} rollout status deployment/{OPERATOR}",
                    f"kubectl -n {job_ns} apply -f manifests/examples/digits-allreduce.yaml",
                    f"kubectl -n {job_ns} get ej", "scale ej/digits --replicas=", "delete ej/digits"):
        assert command in notes, command
    if values.get("watchAllNamespaces"):
        assert "all namespaces" in notes and "team-a" in notes
    elif values.get("watchNamespaces"):
        assert f"namespaces {', '.join(values['watchNamespaces'])}" in notes
    else:
        assert f"namespace {NAMESPACE}" in notes


# ---- watch scope and private registries: issue 20 -----------------------------------------------------------
def test_operator_watches_the_listed_namespaces_with_a_role_in_each():
    objs = rendered_objects({"watchNamespaces": ["team-a", "team-b"]}, namespace=NAMESPACE)
    assert operator_container(objs)["args"][:-3] == ["operator", "--namespace", "team-a", "--namespace", "team-b"]
    assert objects_of("ClusterRole", objs) == [] and objects_of("ClusterRoleBinding", objs) == []
    (default_role,) = [r for r in objects_of("Role", rendered_objects({})) if r["metadata"]["name"] == OPERATOR]
    roles = {r["metadata"]["namespace"]: r for r in objects_of("Role", objs) if r["metadata"]["name"] == OPERATOR}
    bindings = {b["metadata"]["namespace"]: b for b in objects_of("RoleBinding", objs)
                if b["metadata"]["name"] == OPERATOR}
    # Only the watched namespaces: none in the release namespace, which it does not watch.
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    for ns, role in roles.items():
        assert rights(role) == rights(default_role), ns
        assert bindings[ns]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OPERATOR}
        assert bindings[ns]["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]
    # The operator itself stays in the release namespace.
    (deployment,) = objects_of("Deployment", objs)
    assert deployment["metadata"]["namespace"] == NAMESPACE


def test_repeated_watch_namespaces_are_refused_by_the_schema():
    with pytest.raises(helm.HelmValuesError, match="watchNamespaces"):
        render_chart({"watchNamespaces": ["team-a", "team-a"]})


@pytest.mark.parametrize("values, expected", [
    ({}, {NAMESPACE}),
    ({"watchNamespaces": ["team-a", "team-b"]}, {"team-a", "team-b"}),
    ({"watchNamespaces": ["team-a", NAMESPACE], "jobServiceAccount": {"extraNamespaces": [NAMESPACE]}},
     {"team-a", NAMESPACE}),
    ({"watchAllNamespaces": True, "jobServiceAccount": {"extraNamespaces": ["team-a"]}}, {NAMESPACE, "team-a"}),
], ids=["release-namespace", "watch-list", "watched-extra", "all-namespaces"])
def test_job_service_accounts_only_where_the_operator_watches(values, expected):
    objs = rendered_objects(values, namespace=NAMESPACE)
    found = [o["metadata"]["namespace"] for o in job_service_accounts(objs)]
    assert sorted(found) == sorted(expected)


@pytest.mark.parametrize("values, watched", [
    ({"jobServiceAccount": {"extraNamespaces": ["team-x"]}}, NAMESPACE),
    ({"watchNamespaces": ["team-a"], "jobServiceAccount": {"extraNamespaces": ["team-a", "team-x"]}}, "team-a"),
], ids=["release-namespace", "watch-list"])
def test_an_unwatched_extra_namespace_fails_the_render_naming_it(values, watched):
    with pytest.raises(helm.HelmRenderError) as failure:
        render_chart(values, namespace=NAMESPACE)
    message = str(failure.value)
    assert 'does not watch namespace "team-x"' in message, message
    assert f"(it watches {watched})" in message and 'add "team-x" to watchNamespaces' in message, message


def test_watch_all_namespaces_refuses_a_watch_list():
    with pytest.raises(helm.HelmRenderError,
                       match=r"watchNamespaces \(team-a\) must be empty when watchAllNamespaces is true"):
        render_chart({"watchAllNamespaces": True, "watchNamespaces": ["team-a"]})


@pytest.mark.parametrize("bad", [
    {"watchNamespaces": ["Team_A"]},
    {"watchNamespaces": "team-a"},
    {"watchNamespaces": ["x" * 64]},
    {"jobServiceAccount": {"extraNamespaces": ["-a"]}},
    {"jobServiceAccount": {"imagePullSecrets": [{"secret": "regcred"}]}},
    {"jobServiceAccount": {"imagePullSecrets": "regcred"}},
    {"imagePullSecrets": [{"name": "Reg_Cred"}]},
], ids=["uppercase", "not-a-list", "too-long", "leading-dash", "no-name", "not-a-list-of-secrets", "bad-secret-name"])
def test_values_schema_rejects_bad_namespaces_and_pull_secrets(bad):
    with pytest.raises(helm.HelmValuesError, match=next(iter(bad))):
        render_chart(bad)


def test_no_image_pull_secrets_by_default():
    objs = rendered_objects({})
    assert all("imagePullSecrets" not in sa for sa in objects_of("ServiceAccount", objs))
    (deployment,) = objects_of("Deployment", objs)
    assert "imagePullSecrets" not in deployment["spec"]["template"]["spec"]


def test_job_service_accounts_pull_with_the_top_level_secrets_by_default():
    values = {**CHART_VALUE_SETS["all-namespaces"], "imagePullSecrets": [{"name": "regcred"}]}
    objs = rendered_objects(values, namespace=NAMESPACE)
    (deployment,) = objects_of("Deployment", objs)
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    sas = job_service_accounts(objs)
    assert {sa["metadata"]["namespace"] for sa in sas} == {NAMESPACE, "team-a", "team-b"}
    for sa in sas:
        assert sa["imagePullSecrets"] == [{"name": "regcred"}], sa["metadata"]
    (operator_sa,) = [o for o in objects_of("ServiceAccount", objs) if o["metadata"]["name"] == OPERATOR]
    assert "imagePullSecrets" not in operator_sa  # the operator pod names them itself
    notes = render_chart(values, namespace=NAMESPACE)["NOTES.txt"]
    assert "Secret(s) regcred: each of those namespaces needs its own copy" in notes


@pytest.mark.parametrize("job_secrets, expected", [
    ([{"name": "jobs-cred"}, {"name": "mirror-cred"}], [{"name": "jobs-cred"}, {"name": "mirror-cred"}]),
    ([], None),
    (None, [{"name": "regcred"}]),
], ids=["own-secrets", "none", "null-inherits"])
def test_job_image_pull_secrets_override_the_top_level_ones(job_secrets, expected):
    objs = rendered_objects({"watchNamespaces": ["team-a", "team-b"], "imagePullSecrets": [{"name": "regcred"}],
                             "jobServiceAccount": {"imagePullSecrets": job_secrets}}, namespace=NAMESPACE)
    (deployment,) = objects_of("Deployment", objs)
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    sas = job_service_accounts(objs)
    assert [sa["metadata"]["namespace"] for sa in sas] == ["team-a", "team-b"]
    for sa in sas:
        assert sa.get("imagePullSecrets") == expected, sa["metadata"]


def test_chart_crd_is_installed_from_crds_dir():
    (crd,) = helm.Chart.load(str(CHART_DIR)).crds
    assert crd["name"] == "crds/elasticjobs.yaml"
    assert yaml.safe_load(crd["data"])["metadata"]["name"] == "elasticjobs.flextrain.dev"


def test_job_service_account_is_the_one_flextrain_puts_into_pods():
    from flextrain.k8s import meta

    names = {o["metadata"]["name"] for o in rendered_objects({}) if o["kind"] == "ServiceAccount"}
    assert meta.JOB_SERVICE_ACCOUNT in names


# ---- RBAC versus the code: every kubernetes-client call flextrain makes must be granted ----------------------
_CALL = re.compile(r"\.(create|delete|list|read|get|patch|replace)_(namespaced|cluster)_(pod|service_account|service"
                   r"|secret|event|custom_object|role_binding|role|network_policy)(_status)?\(")
_VERB = {"create": "create", "delete": "delete", "list": "list", "read": "get", "get": "get", "patch": "patch",
         "replace": "update"}
_RESOURCE = {"pod": "pods", "service": "services", "secret": "secrets", "event": "events",
             "custom_object": "flextrain.dev/elasticjobs", "service_account": "serviceaccounts",
             "role": "rbac.authorization.k8s.io/roles", "role_binding": "rbac.authorization.k8s.io/rolebindings",
             "network_policy": "networking.k8s.io/networkpolicies"}
# Calls that need no grant in a cluster, with the reason.
_NOT_IN_PRODUCTION = {("flextrain/operator/kube.py", "list", "events"): "Kube.events() serves the tests only"}


def calls_in(*globs: str) -> set[tuple[str, str, str]]:
    """(file, verb, resource) of every kubernetes-client call in the files matching ``globs``."""
    from k8s_static_support import REPO

    found = set()
    for pattern in globs:
        for path in REPO.glob(pattern):
            text = path.read_text()
            for m in _CALL.finditer(text):
                verb, _, kind, status = m.groups()
                resource = _RESOURCE[kind] + ("/status" if status else "")
                if kind == "custom_object" and "podgroup" in text[m.end():m.end() + 120].lower():  # a Volcano PodGroup
                    resource = "scheduling.volcano.sh/podgroups"
                found.add((path.relative_to(REPO).as_posix(), _VERB[verb], resource))
    return found


@pytest.mark.parametrize("who, globs", [
    ("operator", ("flextrain/operator/*.py",)),
    ("master", ("flextrain/master/k8s_*.py",)),
])
def test_rbac_grants_every_call_the_code_makes(who, globs):
    """The operator's Role from the chart; the master's, the Role the operator makes for each job."""
    from flextrain.k8s.access import master_rules

    (role,) = objects_of("Role", rendered_objects({})) if who == "operator" else [{"rules": master_rules("j")}]
    granted = rights(role)
    calls = calls_in(*globs)
    assert calls, f"no kubernetes-client calls found in {globs}: the scan is broken"
    for path, verb, resource in sorted(calls):
        if (path, verb, resource) in _NOT_IN_PRODUCTION:
            continue
        assert verb in granted.get(resource, set()), f"{path} calls {verb} on {resource}; the {who} Role lacks it"


def test_metrics_the_operator_port_and_optional_service_monitors():
    objs = rendered_objects({}, namespace=NAMESPACE)
    container = operator_container(objs)
    assert container["args"][-3:-1] == ["--metrics-port", "8080"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    (svc,) = [s for s in objects_of("Service", objs) if s["metadata"]["name"].endswith("-operator-metrics")]
    assert svc["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    assert not objects_of("ServiceMonitor", objs)  # the Prometheus Operator's CRD may not exist: off by default

    monitored = rendered_objects({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
                                 namespace=NAMESPACE)
    monitors = {m["metadata"]["name"]: m for m in objects_of("ServiceMonitor", monitored)}
    jobs = monitors["flextrain-jobs"]["spec"]
    assert jobs["selector"]["matchLabels"] == {meta.LABEL_ROLE: "master", meta.LABEL_MANAGED_BY: "flextrain"}
    assert jobs["namespaceSelector"] == {"matchNames": [NAMESPACE]} and jobs["endpoints"][0]["port"] == "metrics"
    assert all(m["metadata"]["labels"]["release"] == "prom" for m in monitors.values())
    for obj in monitored:  # everything else still validates against Kubernetes' own schema
        if obj["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(obj, kube_versions()[-1], strict=True)

    off = rendered_objects({"metrics": {"operatorPort": 0}}, namespace=NAMESPACE)
    assert "--no-metrics" in operator_container(off)["args"] and "ports" not in operator_container(off)
    assert not [s for s in objects_of("Service", off) if s["metadata"]["name"].endswith("-operator-metrics")]


def test_scheduling_value_becomes_the_operators_default_gang():
    objs = rendered_objects({"scheduling": {"gang": "volcano", "queue": "research"}})
    args = operator_container(objs)["args"]
    assert args[-5:-1] == ["--default-gang", "volcano", "--default-queue", "research"]
    assert "--default-gang" not in operator_container(rendered_objects({}))["args"]
