"""End-to-end fixtures: the emulated cluster with the scale subresource (node agent, operator and jobs come from tests/k8s/conftest.py).

kmock's emulator lists ``scale`` among the ElasticJob's subresources but
treats ``.../elasticjobs/NAME/scale`` like the object itself, so a Scale
written there would land as a stray ``spec.replicas``. A real API server maps
it through the CRD's ``specReplicasPath`` / ``statusReplicasPath`` /
``labelSelectorPath``; ``ScaleEmulator`` does the same, reading those paths
from ``manifests/crd.yaml``, so ``kubectl scale`` and the client's
``*_custom_object_scale`` calls work as against a cluster.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp.web
import attrs
import pytest
import yaml
from kmock._internal import enums

K8S_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
CRD = Path(__file__).resolve().parents[3] / "manifests" / "crd.yaml"


def _emulator_module(config):
    """The module object of tests/k8s/conftest.py (conftests share the module name ``conftest``)."""
    for plugin in config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) and Path(plugin.__file__).resolve() == K8S_CONFTEST:
            return plugin
    raise RuntimeError(f"{K8S_CONFTEST} is not loaded")


def _scale_paths() -> dict[str, list[str]]:
    crd = next(d for d in yaml.safe_load_all(CRD.read_text()) if d and d.get("kind") == "CustomResourceDefinition")
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    scale = version["subresources"]["scale"]
    return {key: scale[key].lstrip(".").split(".")
            for key in ("specReplicasPath", "statusReplicasPath", "labelSelectorPath")}


def _dig(obj: dict, path: list[str]):
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _nest(path: list[str], value) -> dict:
    out = value
    for part in reversed(path):
        out = {part: out}
    return out


def make_scale_emulator(base):
    paths = _scale_paths()

    @attrs.define(kw_only=True)
    class ScaleEmulator(base):
        async def _handle(self, request):
            if request.resource is None or request.subresource != "scale" or request.name is None:
                return await super()._handle(request)
            key = (request.resource, request.namespace, request.name)
            method = str(getattr(request.method, "value", request.method)).upper()
            async with self._lock:
                if key not in self.objects or self.objects[key].deleted:
                    return aiohttp.web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                      "code": 404, "reason": "NotFound"}, status=404)
                obj = self.objects[key]
                if method in ("PATCH", "PUT") or request.action == enums.action.UPDATE:
                    replicas = _dig(request.data or {}, ["spec", "replicas"])
                    if not isinstance(replicas, int) or isinstance(replicas, bool):
                        return aiohttp.web.json_response(
                            {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422,
                             "reason": "Invalid", "message": "spec.replicas: must be an integer"}, status=422)
                    patch = _nest(paths["specReplicasPath"], replicas)
                    patch.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
                    obj.patch(patch)
                    await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})
                raw = obj.raw
            md = raw["metadata"]
            return aiohttp.web.json_response({
                "apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                             if k in md},
                "spec": {"replicas": _dig(raw, paths["specReplicasPath"])},
                "status": {"replicas": _dig(raw, paths["statusReplicasPath"]) or 0,
                           "selector": _dig(raw, paths["labelSelectorPath"]) or ""},
            })

    return ScaleEmulator


@pytest.fixture
def k8s_cluster(request, tmp_path, monkeypatch):
    module = _emulator_module(request.config)
    monkeypatch.setattr(module, "FlexEmulator", make_scale_emulator(module.FlexEmulator))
    cluster = module.Cluster(tmp_path).start()
    yield cluster
    cluster.close()
