"""Offline validation of ``monitoring.coreos.com/v1`` ServiceMonitor objects.

kubernetes-validate ships the schemas of Kubernetes' own kinds, not of CRDs, and tests never
fetch schemas from the web. So this is a strict schema of the ServiceMonitor fields, written
from the Prometheus Operator API reference: unknown fields are errors (a misspelt
``bearerTokenSecret`` is silently ignored by the operator), and the standard parts
(ObjectMeta, LabelSelector) come from kubernetes-validate's own Kubernetes definitions.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
from referencing import Registry, Resource

K8S_VERSION = "1.37.0"
DEFS = "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1."

# Prometheus durations: 30s, 1m30s, 500ms (the operator's `Duration` pattern).
DURATION = {"type": "string",
            "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
SECRET_KEY = {"type": "object", "additionalProperties": False, "required": ["key"],
              "properties": {"name": {"type": "string"}, "key": {"type": "string"}, "optional": {"type": "boolean"}}}
RELABEL = {"type": "array", "items": {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string"}}, "separator": {"type": "string"},
    "targetLabel": {"type": "string"}, "regex": {"type": "string"}, "modulus": {"type": "integer"},
    "replacement": {"type": "string"},
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap",
                        "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase",
                        "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]}}}}
ENDPOINT = {"type": "object", "additionalProperties": False, "properties": {
    "port": {"type": "string"},
    "targetPort": {"type": ["integer", "string"]},
    "path": {"type": "string", "pattern": "^/"},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "params": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
    "interval": DURATION,
    "scrapeTimeout": DURATION,
    "tlsConfig": {"type": "object"},
    "bearerTokenFile": {"type": "string"},
    "bearerTokenSecret": SECRET_KEY,
    "authorization": {"type": "object", "additionalProperties": False, "properties": {
        "type": {"type": "string"}, "credentials": SECRET_KEY}},
    "basicAuth": {"type": "object"},
    "oauth2": {"type": "object"},
    "honorLabels": {"type": "boolean"},
    "honorTimestamps": {"type": "boolean"},
    "trackTimestampsStaleness": {"type": "boolean"},
    "metricRelabelings": RELABEL,
    "relabelings": RELABEL,
    "proxyUrl": {"type": "string"},
    "followRedirects": {"type": "boolean"},
    "enableHttp2": {"type": "boolean"},
    "filterRunning": {"type": "boolean"},
}}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://kubernetes.io/api/servicemonitor-monitoring-v1.json",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"$ref": DEFS + "ObjectMeta"},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector"], "properties": {
            "selector": {"$ref": DEFS + "LabelSelector"},
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
            "endpoints": {"type": "array", "items": ENDPOINT, "minItems": 1},
            "jobLabel": {"type": "string"},
            "targetLabels": {"type": "array", "items": {"type": "string"}},
            "podTargetLabels": {"type": "array", "items": {"type": "string"}},
            "sampleLimit": {"type": "integer", "minimum": 0},
            "targetLimit": {"type": "integer", "minimum": 0},
            "labelLimit": {"type": "integer", "minimum": 0},
            "labelNameLengthLimit": {"type": "integer", "minimum": 0},
            "labelValueLengthLimit": {"type": "integer", "minimum": 0},
            "attachMetadata": {"type": "object", "additionalProperties": False,
                               "properties": {"node": {"type": "boolean"}}},
            "scrapeClass": {"type": "string"},
            "bodySizeLimit": {"type": "string"},
        }},
    },
}


def _definitions() -> dict[str, Any]:
    path = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{K8S_VERSION}-local-strict" / \
        "_definitions.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def validate(doc: dict[str, Any]) -> None:
    registry: Registry[Any] = Resource.from_contents(_definitions()) @ Registry()
    registry = Resource.from_contents(SCHEMA) @ registry
    jsonschema.Draft202012Validator(SCHEMA, registry=registry).validate(doc)
