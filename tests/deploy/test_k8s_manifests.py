"""Kubernetes manifests: every file and every kustomize rendering validates against the Kubernetes
schemas (kubernetes-validate, strict) or, for CRDs, the structural subsets in `crds.py`; and the
objects agree with each other, with the image and with the server's drain settings."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy.support import (
    K8S,
    K8S_VERSIONS,
    by_name,
    image_config,
    kustomize,
    validate_manifest,
    yaml_documents,
)

MANIFESTS = sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")
KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def _id(path: Path) -> str:
    return str(path.relative_to(K8S))


def test_every_directory_with_manifests_is_a_kustomization() -> None:
    assert {p.parent for p in MANIFESTS} <= set(KUSTOMIZATIONS)
    assert {_id(k) for k in KUSTOMIZATIONS} == {"base", "overlays/gpu", "kserve"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=_id)
def test_manifest_file_validates(path: Path, version: str) -> None:
    documents = yaml_documents(path)
    assert documents, f"{path} holds no manifest"
    base = "overlays" not in path.parts
    for obj in documents:
        if base:
            validate_manifest(obj, version)
        else:
            # Overlay patches are partial objects; they are validated in the rendering below.
            assert {"apiVersion", "kind", "metadata"} <= set(obj)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=_id)
def test_kustomize_rendering_validates(directory: Path, version: str) -> None:
    rendered = kustomize(directory)
    assert rendered
    for obj in rendered:
        validate_manifest(obj, version)


def test_validation_rejects_mistakes() -> None:
    """The validators are not vacuous: a typo or a wrong type in each kind of object fails."""
    base = by_name(kustomize(K8S / "base"))
    deployment = copy.deepcopy(base["Deployment/posenc"])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(deployment, K8S_VERSIONS[-1])
    monitor = copy.deepcopy(base["ServiceMonitor/posenc"])
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(monitor, K8S_VERSIONS[-1])
    service = yaml_documents(K8S / "kserve" / "inferenceservice.yaml")[0]
    service["spec"]["predictor"]["model"]["protocolVersion"] = "v3"
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(service, K8S_VERSIONS[-1])
    runtime = yaml_documents(K8S / "kserve" / "servingruntime.yaml")[0]
    runtime["spec"]["containers"][0]["imagee"] = "posenc"
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(runtime, K8S_VERSIONS[-1])
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate_manifest({"apiVersion": "example.com/v1", "kind": "Unknown"}, K8S_VERSIONS[-1])


# --- the objects agree with each other ----------------------------------------------------------


def _server(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = objects["Deployment/posenc"]["spec"]["template"]["spec"]
    return pod


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (container,) = (c for c in pod["containers"] if c["name"] == name)
    return container


def _config(objects: dict[str, dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = objects["ConfigMap/posenc-config"]["data"]
    return data


@pytest.fixture(scope="module")
def base() -> dict[str, dict[str, Any]]:
    return by_name(kustomize(K8S / "base"))


@pytest.fixture(scope="module")
def gpu() -> dict[str, dict[str, Any]]:
    return by_name(kustomize(K8S / "overlays" / "gpu"))


def test_base_holds_every_object(base: dict[str, dict[str, Any]]) -> None:
    expected = {
        "Deployment/posenc",
        "Service/posenc",
        "ConfigMap/posenc-config",
        "Secret/posenc-api-keys",
        "HorizontalPodAutoscaler/posenc",
        "PodDisruptionBudget/posenc",
        "ServiceMonitor/posenc",
        "Deployment/posenc-cache",
        "Service/posenc-cache",
    }
    assert expected <= set(base)
    assert any(re.fullmatch(r"ConfigMap/posenc-cache-nginx-\w+", name) for name in base)


@pytest.mark.parametrize("variant", ["base", "gpu"])
def test_termination_outlasts_the_drain(
    variant: str, base: dict[str, dict[str, Any]], gpu: dict[str, dict[str, Any]]
) -> None:
    """SIGTERM comes after the preStop sleep; the server then drains and waits for requests."""
    objects = base if variant == "base" else gpu
    pod = _server(objects)
    config = _config(objects)
    pre_stop = _container(pod, "posenc")["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(config["POSENC_DRAIN_SECONDS"])
    grace = float(config["POSENC_GRACE_SECONDS"])
    assert pre_stop > 0
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain + grace


def test_probes_use_the_health_routes(base: dict[str, dict[str, Any]]) -> None:
    container = _container(_server(base), "posenc")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = _config(base)
    assert ports == {"http": int(config["POSENC_PORT"]), "grpc": int(config["POSENC_GRPC_PORT"])}
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == "http"


def test_server_pod_is_hardened_and_matches_the_image(base: dict[str, dict[str, Any]]) -> None:
    pod = _server(base)
    container = _container(pod, "posenc")
    uid, gid = (int(part) for part in image_config("cpu")["user"].split(":"))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (uid, gid)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    # A Service named `posenc` would otherwise inject POSENC_PORT=tcp://... into the environment.
    assert pod["enableServiceLinks"] is False
    assert "limits" in container["resources"]
    assert "requests" in container["resources"]


def test_server_reads_config_and_secret(base: dict[str, dict[str, Any]]) -> None:
    container = _container(_server(base), "posenc")
    sources = {
        ("configMapRef" if "configMapRef" in s else "secretRef"): next(iter(s.values()))["name"]
        for s in container["envFrom"]
    }
    assert sources == {"configMapRef": "posenc-config", "secretRef": "posenc-api-keys"}
    assert set(base["Secret/posenc-api-keys"]["stringData"]) == {"POSENC_API_KEYS"}


def test_selectors_and_ports_line_up(base: dict[str, dict[str, Any]]) -> None:
    pod_labels = base["Deployment/posenc"]["spec"]["template"]["metadata"]["labels"]
    service = base["Service/posenc"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port, grpc = service["spec"]["ports"]
    assert (port["name"], port["targetPort"], port["port"]) == ("http", "http", 8000)
    # the Open Inference Protocol over gRPC on Triton's port, HTTP/2 without TLS
    assert (grpc["name"], grpc["targetPort"], grpc["port"]) == ("grpc", "grpc", 8001)
    assert grpc["appProtocol"] == "kubernetes.io/h2c"
    for selector in (
        base["Deployment/posenc"]["spec"]["selector"]["matchLabels"],
        base["PodDisruptionBudget/posenc"]["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items()
    monitor = base["ServiceMonitor/posenc"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["endpoints"]] == [port["name"]]
    assert monitor["endpoints"][0]["path"] == "/metrics"
    target = base["HorizontalPodAutoscaler/posenc"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "posenc")
    # The HPA owns the replica count; a `replicas` field would reset it on every apply.
    assert "replicas" not in base["Deployment/posenc"]["spec"]


def test_cache_fronts_the_server_service(base: dict[str, dict[str, Any]]) -> None:
    """nginx.conf's upstream is the posenc Service; the cache pod mounts the generated config."""
    server_port = base["Service/posenc"]["spec"]["ports"][0]["port"]
    (config_name,) = (n for n in base if n.startswith("ConfigMap/posenc-cache-nginx-"))
    nginx_conf = base[config_name]["data"]["nginx.conf"]
    assert f"server posenc:{server_port};" in nginx_conf
    assert nginx_conf == (K8S / "base" / "nginx.conf").read_text(encoding="utf-8")
    pod = base["Deployment/posenc-cache"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    nginx = _container(pod, "nginx")
    mounts = {m["mountPath"]: m for m in nginx["volumeMounts"]}
    conf = mounts["/etc/nginx/nginx.conf"]
    assert volumes[conf["name"]]["configMap"]["name"] == config_name.split("/", 1)[1]
    assert conf["subPath"] == "nginx.conf"
    # What nginx writes: its cache and /tmp (pid, temp files), both emptyDirs.
    assert "emptyDir" in volumes[mounts["/var/cache/nginx"]["name"]]
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert nginx["securityContext"]["readOnlyRootFilesystem"] is True
    listen = re.search(r"^\s*listen (\d+);", nginx_conf, re.MULTILINE)
    assert listen is not None
    assert [p["containerPort"] for p in nginx["ports"]] == [int(listen.group(1))]
    cache_service = base["Service/posenc-cache"]["spec"]
    assert cache_service["ports"][0]["targetPort"] == nginx["ports"][0]["name"]


def test_cache_volume_holds_the_cache(base: dict[str, dict[str, Any]]) -> None:
    """The emptyDir's sizeLimit leaves room above proxy_cache_path max_size."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    nginx_conf = (K8S / "base" / "nginx.conf").read_text(encoding="utf-8")
    size = re.search(r"max_size=(\d+)([kmg])", nginx_conf)
    assert size is not None
    max_size = int(size.group(1)) * units[size.group(2)]
    pod = base["Deployment/posenc-cache"]["spec"]["template"]["spec"]
    (cache,) = (v for v in pod["volumes"] if v["name"] == "cache")
    limit = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", cache["emptyDir"]["sizeLimit"])
    assert limit is not None
    assert int(limit.group(1)) * units[limit.group(2)] >= max_size * 3 // 2


def test_disruption_budget_never_blocks_a_drain(
    base: dict[str, dict[str, Any]], gpu: dict[str, dict[str, Any]]
) -> None:
    for objects in (base, gpu):
        pdb = objects["PodDisruptionBudget/posenc"]["spec"]
        hpa = objects["HorizontalPodAutoscaler/posenc"]["spec"]
        if "maxUnavailable" in pdb:
            assert pdb["maxUnavailable"] >= 1
        else:
            assert hpa["minReplicas"] > pdb["minAvailable"]


def test_gpu_overlay(base: dict[str, dict[str, Any]], gpu: dict[str, dict[str, Any]]) -> None:
    pod = _server(gpu)
    container = _container(pod, "posenc")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in _container(_server(base), "posenc")["resources"]["limits"]
    assert container["image"].endswith(":cuda")
    assert _container(_server(base), "posenc")["image"].endswith(":cpu")
    assert _config(gpu)["POSENC_DEVICE"] == "cuda"
    assert _config(base)["POSENC_DEVICE"] == "cpu"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # The patch merged into the base rather than replacing it.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    # The GPU image is what the Dockerfile's cuda target sets up.
    assert image_config("cuda")["env"]["POSENC_DEVICE"] == "cuda"


def test_kserve_example_speaks_v2() -> None:
    objects = by_name(kustomize(K8S / "kserve"))
    runtime = objects["ServingRuntime/posenc"]["spec"]
    service = objects["InferenceService/posenc"]["spec"]["predictor"]
    assert runtime["protocolVersions"] == ["v2"]
    assert service["model"]["protocolVersion"] == "v2"
    assert service["model"]["runtime"] == "posenc"
    formats = {f["name"] for f in runtime["supportedModelFormats"]}
    assert service["model"]["modelFormat"]["name"] in formats
    (container,) = runtime["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert [p["containerPort"] for p in container["ports"]] == [int(env["POSENC_PORT"])]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert service["enableServiceLinks"] is False


def test_kserve_grpc_example_speaks_grpc_v2() -> None:
    """The gRPC twin: one h2c port, the gRPC port the server is told, readiness from the image's
    health check (the routed port speaks gRPC only)."""
    objects = by_name(kustomize(K8S / "kserve"))
    runtime = objects["ServingRuntime/posenc-grpc"]["spec"]
    service = objects["InferenceService/posenc-grpc"]["spec"]["predictor"]
    assert runtime["protocolVersions"] == ["grpc-v2"]
    assert service["model"]["protocolVersion"] == "grpc-v2"
    assert service["model"]["runtime"] == "posenc-grpc"
    (container,) = runtime["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    for ports in (container["ports"], service["model"]["ports"]):
        assert [(p["name"], p["containerPort"]) for p in ports] == [
            ("h2c", int(env["POSENC_GRPC_PORT"]))
        ]
    assert int(env["POSENC_GRPC_PORT"]) == 8001
    assert container["readinessProbe"]["exec"]["command"][-1] == "/opt/posenc/healthcheck.py"
    assert service["enableServiceLinks"] is False
