"""The fields that say which object a manifest is, and the types they must have.

Owns the one rule every reader of objects applies — ``gpuguard check`` (through
:func:`policies.facts.review.from_object`), ``gpuguard gpus``, ``gpuguard test`` and the audit
(through :func:`policies.facts.workloads.find_workload`'s ``invalid``): ``kind``,
``metadata.name``, ``metadata.generateName`` and ``metadata.namespace`` are strings when given,
and ``metadata`` is a map. YAML reads an unquoted ``namespace: 2024`` as a number and
``name: 1.5`` as a float; the API server refuses such an object (its ObjectMeta fields are
strings: Kubernetes API reference, ObjectMeta), so reading it as the string ``"2024"`` would judge
an object that can never exist, and one that reads ``"2024"`` while another skips it would give
two commands two answers.

Must not decide whether a name is *required* (the workload reader does, per kind) or check the
names' syntax (the API server's RFC 1123 rules are the CLI's, for the names it is given).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.value_words import described

#: The ObjectMeta fields that name an object, in the order their problems are listed.
NAME_FIELDS = ("namespace", "name", "generateName")


def identity_problems(obj: Mapping[str, Any]) -> list[str]:
    """The problems of ``obj``'s identity fields, each ``"<path>: expected <type>, got <type>"``
    (``kind``, ``metadata``, ``metadata.namespace``, ``metadata.name``,
    ``metadata.generateName``); empty when each is absent, null or of its API type.

    The common case (every field a string) costs a few type checks: this runs for every object
    the audit and ``check`` read.
    """
    problems = []
    kind = obj.get("kind")
    if kind is not None and not isinstance(kind, str):
        problems.append(f"kind: expected a string, got {described(kind)}")
    metadata = obj.get("metadata")
    if metadata is None:
        return problems
    if not isinstance(metadata, Mapping):
        problems.append(f"metadata: expected a map, got {described(metadata)}")
        return problems
    for key in NAME_FIELDS:
        value = metadata.get(key)
        if value is not None and not isinstance(value, str):
            problems.append(f"metadata.{key}: expected a string, got {described(value)}")
    return problems


def namespace_of(metadata: Mapping[str, Any]) -> str | None:
    """The namespace ``metadata`` names: None when absent, null, empty or not a string.

    ``namespace: ""`` is unset, as the API server reads it (it fills in the request's namespace,
    ``default`` for ``kubectl apply`` without ``-n``): an object with ``""`` and one without are
    the same object to every report (a mistyped value is reported by :func:`identity_problems`).
    """
    namespace = metadata.get("namespace")
    return namespace if isinstance(namespace, str) and namespace else None
