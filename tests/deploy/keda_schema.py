"""A JSON Schema of KEDA's ScaledObject (keda.sh/v1alpha1), for the fields this project uses and their siblings.

kubernetes-validate knows only Kubernetes' own kinds, so the ScaledObject is checked here: every field of its spec
by name and type (an unknown or misspelled field fails, as `--strict` does for built-in kinds), the Prometheus
trigger's metadata by the scaler's parameter names. Written from KEDA's CRD and scaler reference:
https://keda.sh/docs/2.16/reference/scaledobject-spec/ , https://keda.sh/docs/2.16/scalers/prometheus/
"""

from __future__ import annotations

from typing import Any

INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
NUMBER_TEXT = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"}
"""Trigger metadata is a map of strings; thresholds are numbers written as strings."""

HPA_POLICY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type", "value", "periodSeconds"],
    "properties": {
        "type": {"enum": ["Pods", "Percent"]},
        "value": {"type": "integer", "minimum": 1},
        "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
    },
}
HPA_RULES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {"type": "array", "items": HPA_POLICY},
    },
}
PROMETHEUS_METADATA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["serverAddress", "query", "threshold"],
    "properties": {
        "serverAddress": {"type": "string", "pattern": "^https?://"},
        "query": {"type": "string", "minLength": 1},
        "threshold": NUMBER_TEXT,
        "activationThreshold": NUMBER_TEXT,
        "namespace": {"type": "string"},
        "customHeaders": {"type": "string"},
        "ignoreNullValues": {"enum": ["true", "false"]},
        "queryParameters": {"type": "string"},
        "unsafeSsl": {"enum": ["true", "false"]},
        "timeout": {"type": "string"},
    },
}
TRIGGER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type", "metadata"],
    "properties": {
        "type": {"type": "string", "minLength": 1},
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "authenticationRef": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "kind": {"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]},
            },
        },
        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
        "useCachedMetrics": {"type": "boolean"},
    },
    "if": {"properties": {"type": {"const": "prometheus"}}},
    "then": {"properties": {"metadata": PROMETHEUS_METADATA}},
}
SCALED_OBJECT: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string", "minLength": 1},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": INT32,
                "cooldownPeriod": INT32,
                "initialCooldownPeriod": INT32,
                "idleReplicaCount": INT32,
                "minReplicaCount": INT32,
                "maxReplicaCount": INT32,
                "fallback": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["failureThreshold", "replicas"],
                    "properties": {
                        "failureThreshold": INT32,
                        "replicas": INT32,
                        "behavior": {
                            "enum": ["static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower"]
                        },
                    },
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"scaleUp": HPA_RULES, "scaleDown": HPA_RULES},
                                },
                            },
                        },
                        "scalingModifiers": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "formula": {"type": "string"},
                                "target": {"type": "string"},
                                "activationTarget": {"type": "string"},
                                "metricType": {"enum": ["AverageValue", "Value"]},
                            },
                        },
                    },
                },
                "triggers": {"type": "array", "minItems": 1, "items": TRIGGER},
            },
        },
    },
}
