"""Structural schemas for the custom resources posenc ships, where kubernetes-validate has none.

kubernetes-validate knows the built-in kinds only. `ServiceMonitor` (Prometheus Operator),
`ServingRuntime` and `InferenceService` (KServe) are CRDs, so their manifests are checked here
against hand-written JSON schemas. Each is a strict *subset* of the CRD's openAPIV3Schema
(monitoring.coreos.com_servicemonitors.yaml of prometheus-operator; serving.kserve.io_*.yaml of
KServe): the same field names, types, enums and patterns, `additionalProperties: false` at every
level we spell out, and the embedded Kubernetes types (Container, LabelSelector, ObjectMeta,
ResourceRequirements, EnvVar, Toleration) taken from kubernetes-validate's own definitions. A typo
or a field outside the subset fails; a new field needs adding here after checking it in the CRD.
"""

from __future__ import annotations

from typing import Any

DEFINITIONS = "https://kubernetes.io/api/_definitions.json#/$defs/"


def k8s(name: str) -> dict[str, Any]:
    """A reference to a built-in Kubernetes type, e.g. `io.k8s.api.core.v1.Container`."""
    return {"$ref": DEFINITIONS + name}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": k8s("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
            "spec": spec,
        },
    }


# Prometheus duration, as in the CRD (`interval`, `scrapeTimeout`).
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
    r"(([0-9]+)s)?(([0-9]+)ms)?)$",
}

SERVICE_MONITOR = _resource(
    "monitoring.coreos.com/v1",
    "ServiceMonitor",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "endpoints"],
        "properties": {
            "jobLabel": {"type": "string"},
            "selector": k8s("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"),
            "namespaceSelector": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                },
            },
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                        "interval": _DURATION,
                        "scrapeTimeout": _DURATION,
                        "honorLabels": {"type": "boolean"},
                    },
                },
            },
        },
    },
)

_MODEL_FORMAT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "version": {"type": "string"}},
}
_PROTOCOL = {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}

SERVING_RUNTIME = _resource(
    "serving.kserve.io/v1alpha1",
    "ServingRuntime",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["containers"],
        "properties": {
            "supportedModelFormats": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "version": {"type": "string"},
                        "autoSelect": {"type": "boolean"},
                        "priority": {"type": "integer", "minimum": 1},
                    },
                },
            },
            "protocolVersions": {"type": "array", "items": _PROTOCOL},
            "multiModel": {"type": "boolean"},
            "disabled": {"type": "boolean"},
            "containers": {
                "type": "array",
                "minItems": 1,
                "items": k8s("io.k8s.api.core.v1.Container"),
            },
            "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
            "tolerations": {"type": "array", "items": k8s("io.k8s.api.core.v1.Toleration")},
        },
    },
)

INFERENCE_SERVICE = _resource(
    "serving.kserve.io/v1beta1",
    "InferenceService",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["predictor"],
        "properties": {
            "predictor": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    # ComponentExtensionSpec
                    "minReplicas": {"type": "integer", "minimum": 0},
                    "maxReplicas": {"type": "integer", "minimum": 0},
                    "scaleTarget": {"type": "integer"},
                    "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
                    "containerConcurrency": {"type": "integer"},
                    "timeout": {"type": "integer"},
                    # The inlined PodSpec fields posenc uses.
                    "enableServiceLinks": {"type": "boolean"},
                    "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                    "tolerations": {
                        "type": "array",
                        "items": k8s("io.k8s.api.core.v1.Toleration"),
                    },
                    "model": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["modelFormat"],
                        "properties": {
                            "modelFormat": _MODEL_FORMAT,
                            "runtime": {"type": "string"},
                            "protocolVersion": _PROTOCOL,
                            "storageUri": {"type": "string"},
                            # The inlined Container fields posenc uses.
                            "env": {"type": "array", "items": k8s("io.k8s.api.core.v1.EnvVar")},
                            "ports": {
                                "type": "array",
                                "items": k8s("io.k8s.api.core.v1.ContainerPort"),
                            },
                            "resources": k8s("io.k8s.api.core.v1.ResourceRequirements"),
                        },
                    },
                },
            }
        },
    },
)

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): SERVING_RUNTIME,
    ("serving.kserve.io/v1beta1", "InferenceService"): INFERENCE_SERVICE,
}
