"""The CustomResourceDefinitions of gpuguard's documents, generated from their JSON Schemas.

Owns turning ``policies/data/{gpupolicy,gpuquota,gpupolicyexception}.schema.json`` — the schemas
``gpuguard lint`` checks documents against — into ``apiextensions.k8s.io/v1`` CRDs under
``gpuguard.io``, so that the file schema, the CRD and lint cannot disagree: the CRDs are written
from the schemas (``gpuguard crds``) and a test keeps the shipped ones equal to what is written.

The JSON Schema (draft 2020-12) becomes a *structural* OpenAPI v3 schema, as the API server
requires (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/
custom-resource-definitions/#specifying-a-structural-schema):

* ``$ref`` to ``$defs`` is inlined; ``const`` becomes a one-value ``enum``; each node gets its
  ``type`` (from ``enum`` values where the schema leaves it out); a free-form ``object`` (GPUPolicy
  ``params``) keeps unknown fields (``x-kubernetes-preserve-unknown-fields``).
* ``additionalProperties: false`` is dropped: a structural schema prunes unknown fields instead,
  and ``kubectl apply`` (server-side field validation ``Strict``) refuses them, naming the field.
* ``uniqueItems`` (forbidden in CRDs) becomes ``x-kubernetes-list-type: set``; the lists whose
  entries lint requires unique names for (``matchConditions``, ``variables``,
  :meth:`policies.policy.loader._Builder.rules`) become ``x-kubernetes-list-type: map`` keyed by
  ``name``.
* ``anyOf`` / ``oneOf`` alternatives keep ``required`` and value rules on properties the node
  itself specifies (GPUPolicy: validations, mutations or auditAnnotations present *and* not
  empty); nothing else is structural inside them.
* ``propertyNames`` (not in OpenAPI) becomes an ``x-kubernetes-validations`` CEL rule.
* ``default`` is copied: the API server stores the value the loader assumes when the field is
  absent (``failurePolicy: Fail``, ``validationActions: [Deny]``), so ``kubectl get`` prints it.
* ``metadata`` keeps only its ``name`` rule (a CRD may constrain nothing else there); the
  document's ``apiVersion`` and ``kind`` are the API server's.

What no schema can state — that CEL compiles, that ``params.x`` and ``variables.x`` exist — stays
with lint (and, for objects read from the cluster, the controller's ``Accepted`` condition).
Must not read files other than the packaged schemas, or talk to a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from policies.sources import load_package_yaml

GROUP: Final = "gpuguard.io"
VERSION: Final = "v1alpha1"

#: Lists whose entries lint requires unique names for (loader: "name ... is used more than
#: once"): a map list keyed by ``name`` makes the API server refuse duplicates too.
_MAP_LISTS: Final = frozenset({("spec", "matchConditions"), ("spec", "variables")})

#: Keywords copied as they are: OpenAPI v3 value validations the API server supports.
_COPIED: Final = ("description", "default", "enum", "format", "pattern", "minLength", "maxLength",
                  "minimum", "maximum", "minItems", "maxItems", "minProperties", "maxProperties",
                  "required")


@dataclass(frozen=True)
class Resource:
    """One CRD: its kind, names, scope, schema file and the columns ``kubectl get`` prints.

    ``columns`` are ``(name, JSONPath, type)`` printed before Ready and Age.
    """

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    scope: str  # Cluster or Namespaced
    schema: str  # file in policies/data
    columns: tuple[tuple[str, str, str], ...]


RESOURCES: Final = (
    Resource("GPUPolicy", "gpupolicies", "gpupolicy", ("gpol",), "Cluster",
             "gpupolicy.schema.json",
             (("Actions", ".spec.validationActions", "string"),
              ("Failure Policy", ".spec.failurePolicy", "string"))),
    Resource("GPUQuota", "gpuquotas", "gpuquota", ("gquota",), "Cluster",
             "gpuquota.schema.json",
             (("Failure Policy", ".spec.failurePolicy", "string"),)),
    Resource("GPUPolicyException", "gpupolicyexceptions", "gpupolicyexception", ("gpolex",),
             "Namespaced", "gpupolicyexception.schema.json",
             (("Policies", ".spec.policies", "string"),
              ("Expires", ".spec.expires", "string"))),
)

#: The ``status`` every object gets: conditions as ``metav1.Condition`` (``Accepted`` with the
#: lint errors and their field paths, ``Ready`` once served) and the generation they describe.
STATUS_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "description": "Written by gpuguard (status subresource only): whether the object was "
                   "accepted and is being served.",
    "properties": {
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "conditions": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": {
                "type": "object",
                "required": ["type", "status", "lastTransitionTime", "reason", "message"],
                "properties": {
                    "type": {"type": "string", "maxLength": 316,
                             "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*"
                                        r"[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?"
                                        r"[A-Za-z0-9])$"},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                    "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                               "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                    "message": {"type": "string", "maxLength": 32768},
                },
            },
        },
    },
}


class SchemaError(ValueError):
    """A JSON Schema construct the generator cannot state structurally (names the path)."""


def _scalar_type(values: list[Any], where: str) -> str:
    kinds = {"string" if isinstance(v, str) else "boolean" if isinstance(v, bool)
             else "integer" if isinstance(v, int) else "number" if isinstance(v, float)
             else "?" for v in values}
    if len(kinds) != 1 or "?" in kinds:
        raise SchemaError(f"{where}: enum of mixed or non-scalar values {values!r}")
    return kinds.pop()


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``node`` with its ``$ref`` inlined (sibling keywords win, as in draft 2020-12)."""
    ref = node.get("$ref")
    if ref is None:
        return dict(node)
    prefix = "#/$defs/"
    if not isinstance(ref, str) or not ref.startswith(prefix) or ref[len(prefix):] not in defs:
        raise SchemaError(f"{where}: $ref {ref!r} is not a local #/$defs/ reference")
    target = _resolve(defs[ref[len(prefix):]], defs, where)
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def structural(node: Mapping[str, Any], defs: Mapping[str, Any],
               path: tuple[str, ...] = ()) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one JSON Schema node (see the module docstring).

    Args:
        node: a JSON Schema (draft 2020-12) node.
        defs: the ``$defs`` its ``$ref`` s point into.
        path: the field names leading to ``node`` (``("spec", "matchConditions")``).

    Raises:
        SchemaError: a keyword that has no structural form (names the path).
    """
    where = ".".join(path) or "(root)"
    node = _resolve(node, defs, where)
    out: dict[str, Any] = {}
    if "const" in node:
        node = {**node, "enum": [node.pop("const")]}
    kind = node.get("type")
    if kind is None:
        if "enum" in node:
            kind = _scalar_type(list(node["enum"]), where)
        elif "properties" in node or "additionalProperties" in node:
            kind = "object"
        else:
            raise SchemaError(f"{where}: no type")
    if not isinstance(kind, str):
        raise SchemaError(f"{where}: type {kind!r} (a structural schema has one type)")
    out["type"] = kind
    for key in _COPIED:
        if key in node:
            out[key] = node[key]
    for key in ("anyOf", "oneOf"):
        if key in node:
            out[key] = [_alternative(b, node.get("properties") or {}, f"{where}.{key}")
                        for b in node[key]]
    unknown = set(node) - {*_COPIED, "type", "const", "anyOf", "oneOf", "properties",
                           "additionalProperties", "items", "uniqueItems", "propertyNames",
                           "$ref", "title"}
    if unknown:
        raise SchemaError(f"{where}: unsupported keyword(s) {sorted(unknown)}")
    if kind == "object":
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if properties:
            out["properties"] = {name: structural(child, defs, (*path, name))
                                 for name, child in properties.items()}
        if isinstance(extra, Mapping):
            if properties:
                raise SchemaError(f"{where}: properties and a schema for additionalProperties "
                                  "cannot both be structural")
            out["additionalProperties"] = structural(extra, defs, (*path, "*"))
        elif not properties and extra is not False and "maxProperties" not in node:
            out["x-kubernetes-preserve-unknown-fields"] = True  # a free-form map (params)
        names = node.get("propertyNames")
        if names is not None:
            if set(names) != {"pattern"}:
                raise SchemaError(f"{where}.propertyNames: only a pattern can be stated")
            out["x-kubernetes-validations"] = [{
                "rule": f"self.all(k, k.matches({_cel_string(names['pattern'])}))",
                "message": f"every key must match {names['pattern']}"}]
    elif kind == "array":
        if "items" not in node:
            raise SchemaError(f"{where}: an array needs items")
        out["items"] = structural(node["items"], defs, (*path, "[]"))
        if path in _MAP_LISTS:
            out["x-kubernetes-list-type"] = "map"
            out["x-kubernetes-list-map-keys"] = ["name"]
        elif node.get("uniqueItems"):
            if out["items"]["type"] in ("object", "array"):
                raise SchemaError(f"{where}: uniqueItems of objects has no structural form")
            out["x-kubernetes-list-type"] = "set"
    return out


#: What an ``anyOf`` / ``oneOf`` alternative may say of a property (a value validation, no type):
#: a structural schema allows these inside a junctor for a property specified outside it.
_JUNCTOR_VALUES: Final = frozenset({"minItems", "maxItems", "minLength", "maxLength"})


def _alternative(branch: Any, properties: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One ``anyOf`` / ``oneOf`` alternative: ``required`` and, for properties the node itself
    specifies, value validations (``{"required": ["validations"], "properties":
    {"validations": {"minItems": 1}}}``: present and not empty)."""
    if not isinstance(branch, Mapping) or not set(branch) <= {"required", "properties"}:
        raise SchemaError(f"{where}: only 'required' and 'properties' alternatives are "
                          "structural")
    out: dict[str, Any] = {k: v for k, v in branch.items() if k == "required"}
    for name, rules in (branch.get("properties") or {}).items():
        if name not in properties or not isinstance(rules, Mapping) or \
                not set(rules) <= _JUNCTOR_VALUES:
            raise SchemaError(f"{where}.properties.{name}: only {sorted(_JUNCTOR_VALUES)} of a "
                              "property specified outside the alternatives are structural")
        out.setdefault("properties", {})[name] = dict(rules)
    return out


def _cel_string(text: str) -> str:
    """A CEL string literal of ``text`` (single-quoted raw string: regexes keep their
    backslashes)."""
    if "'" in text or "\n" in text:
        raise SchemaError(f"pattern {text!r} cannot be a raw CEL string")
    return f"r'{text}'"


def _metadata(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata``: only ``name`` may be constrained in a CRD; the rest is the API server's."""
    name = node.get("properties", {}).get("name")
    if name is None:
        return {"type": "object"}
    return {"type": "object", "properties": {"name": structural(name, defs,
                                                                ("metadata", "name"))}}


def open_api_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of one document schema (its ``spec`` and a ``status``).

    Raises:
        SchemaError: the schema has a construct with no structural form.
    """
    defs = schema.get("$defs", {})
    properties = schema["properties"]
    return {
        "type": "object",
        "description": schema.get("description", ""),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": _metadata(properties["metadata"], defs),
            "spec": structural(properties["spec"], defs, ("spec",)),
            "status": dict(STATUS_SCHEMA),
        },
    }


def definition(resource: Resource) -> dict[str, Any]:
    """The CustomResourceDefinition of ``resource`` (from its packaged JSON Schema).

    Raises:
        SchemaError: the schema has a construct with no structural form.
    """
    schema = load_package_yaml("policies.data", resource.schema)
    columns = [{"name": name, "type": kind, "jsonPath": json_path}
               for name, json_path, kind in resource.columns]
    columns += [
        {"name": "Ready", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{resource.plural}.{GROUP}",
                     "labels": {"app.kubernetes.io/name": "gpuguard"}},
        "spec": {
            "group": GROUP,
            "scope": resource.scope,
            "names": {"kind": resource.kind, "listKind": f"{resource.kind}List",
                      "plural": resource.plural, "singular": resource.singular,
                      "shortNames": list(resource.short_names), "categories": ["gpuguard"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": open_api_schema(schema)},
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
            }],
        },
    }


def definitions() -> list[dict[str, Any]]:
    """Every CRD, in :data:`RESOURCES` order."""
    return [definition(resource) for resource in RESOURCES]
