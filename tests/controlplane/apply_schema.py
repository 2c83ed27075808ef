"""The structured-merge facts of Pods and workloads, read from a real kube-apiserver's OpenAPI v3.

``python -m tests.controlplane.apply_schema`` starts the tier's control plane, reads
``/openapi/v3/api/v1``, ``/apis/apps/v1`` and ``/apis/batch/v1`` and writes
``policies/data/apply-schema.json``: for every definition reachable from the workload kinds,
each field's shape (struct reference, list with its ``x-kubernetes-list-type`` and
``x-kubernetes-list-map-keys``, map, scalar with its type: :func:`scalar`) and
``x-kubernetes-map-type: atomic``. The merge of
``patchType: ApplyConfiguration`` mutations (:mod:`policies.policy.apply`) reads that file;
``test_apply_schema.py`` checks the checked-in file is what this server says.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.paths import ROOT

OUTPUT = ROOT / "policies" / "data" / "apply-schema.json"
GROUPS = ("api/v1", "apis/apps/v1", "apis/batch/v1")
ROOTS = {  # apiVersion/kind -> OpenAPI definition
    "v1/Pod": "io.k8s.api.core.v1.Pod",
    "v1/PodTemplate": "io.k8s.api.core.v1.PodTemplate",
    "v1/ReplicationController": "io.k8s.api.core.v1.ReplicationController",
    "apps/v1/Deployment": "io.k8s.api.apps.v1.Deployment",
    "apps/v1/StatefulSet": "io.k8s.api.apps.v1.StatefulSet",
    "apps/v1/DaemonSet": "io.k8s.api.apps.v1.DaemonSet",
    "apps/v1/ReplicaSet": "io.k8s.api.apps.v1.ReplicaSet",
    "batch/v1/Job": "io.k8s.api.batch.v1.Job",
    "batch/v1/CronJob": "io.k8s.api.batch.v1.CronJob",
}
_REF = "#/components/schemas/"


def _reference(schema: Mapping[str, Any]) -> str | None:
    if "$ref" in schema:
        return str(schema["$ref"]).removeprefix(_REF)
    for part in schema.get("allOf") or ():
        if "$ref" in part:
            return str(part["$ref"]).removeprefix(_REF)
    return None


def scalar(schema: Mapping[str, Any]) -> str:
    """A scalar's shape, ``scalar:<type>``: ``string``, ``date-time`` (``metav1.Time``),
    ``boolean``, ``int32``, ``int64``, ``double``, ``int-or-string``, ``quantity`` (``oneOf``
    string or number: ``resource.Quantity``), or ``any`` (an object without properties, which
    the API server keeps as it is: ``FieldsV1``, empty structs)."""
    kind, form = schema.get("type"), schema.get("format")
    if schema.get("x-kubernetes-int-or-string") or form == "int-or-string":
        return "scalar:int-or-string"
    if kind == "string":
        return "scalar:date-time" if form == "date-time" else "scalar:string"
    if kind == "integer":
        return "scalar:int32" if form == "int32" else "scalar:int64"
    if kind in ("boolean", "number"):
        return "scalar:boolean" if kind == "boolean" else "scalar:double"
    if {part.get("type") for part in schema.get("oneOf") or ()} == {"string", "number"}:
        return "scalar:quantity"
    return "scalar:any"


def _shape(schema: Mapping[str, Any], pending: list[str]) -> Any:
    """One field's shape: a definition name, or ``{"list": ..., "keys": [...], "items": ...}``,
    ``{"map": ..., "atomic": true}``, a :func:`scalar`."""
    ref = _reference(schema)
    if ref is not None:
        pending.append(ref)
        return ref
    if schema.get("type") == "array":
        shape: dict[str, Any] = {"list": schema.get("x-kubernetes-list-type", "atomic"),
                                 "items": _shape(schema.get("items") or {}, pending)}
        if schema.get("x-kubernetes-list-map-keys"):
            shape["keys"] = list(schema["x-kubernetes-list-map-keys"])
        return shape
    if schema.get("type") == "object" and "additionalProperties" in schema:
        shape = {"map": _shape(schema["additionalProperties"] or {}, pending)}
        if schema.get("x-kubernetes-map-type") == "atomic":
            shape["atomic"] = True
        return shape
    return scalar(schema)


def facts(schemas: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The definitions reachable from :data:`ROOTS`, each ``{"fields": {...}}`` (plus
    ``"atomic": true`` for ``x-kubernetes-map-type: atomic`` structs and ``"defaults"``, the
    scalar defaults), sorted by name."""
    definitions: dict[str, Any] = {}
    pending = list(ROOTS.values())
    while pending:
        name = pending.pop()
        if name in definitions:
            continue
        schema = schemas[name]
        properties = schema.get("properties")
        if not properties:  # Quantity, IntOrString, Time, RawExtension: scalars to SMD
            definitions[name] = scalar(schema) if schema.get("type") != "object" or \
                "additionalProperties" not in schema else _shape(schema, pending)
            continue
        entry: dict[str, Any] = {"fields": {k: _shape(v, pending)
                                            for k, v in sorted(properties.items())}}
        if schema.get("x-kubernetes-map-type") == "atomic":
            entry["atomic"] = True
        defaults = {k: v["default"] for k, v in sorted(properties.items())
                    if "default" in v and not isinstance(v["default"], dict | list)}
        if defaults:  # a list-map key's default stands in for it (ContainerPort.protocol)
            entry["defaults"] = defaults
        definitions[name] = entry
    return {"source": "kube-apiserver /openapi/v3 (" + ", ".join(GROUPS) + ")",
            "kinds": ROOTS, "definitions": dict(sorted(definitions.items()))}


def read_schemas(get: Any) -> dict[str, Any]:
    """Every component schema of :data:`GROUPS`; ``get(path)`` returns ``(status, text)``."""
    schemas: dict[str, Any] = {}
    for group in GROUPS:
        status, text = get(f"/openapi/v3/{group}")
        if status != 200:
            raise RuntimeError(f"/openapi/v3/{group}: HTTP {status}: {text[:200]}")
        schemas.update(json.loads(text)["components"]["schemas"])
    return schemas


def render(data: Mapping[str, Any]) -> str:
    """The file's text: one definition per line, so a diff shows what the server changed."""
    lines = [f' "source": {json.dumps(data["source"])},',
             f' "kinds": {json.dumps(data["kinds"], sort_keys=True)},', ' "definitions": {']
    items = list(data["definitions"].items())
    lines += [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
              + ("," if i < len(items) - 1 else "") for i, (k, v) in enumerate(items)]
    return "{\n" + "\n".join(lines) + "\n }\n}\n"


def main() -> int:
    from tests.controlplane.cluster import ControlPlane, build_binaries

    folder, _ = build_binaries()
    with ControlPlane(folder) as cluster:
        text = render(facts(read_schemas(lambda path: cluster.get_raw(path, timeout_s=60))))
    Path(OUTPUT).write_text(text, encoding="utf-8")
    print(f"{OUTPUT}: {len(text)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
