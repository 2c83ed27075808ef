"""The Kubernetes CEL JSONPatch library (``k8s.io/apiserver/pkg/cel/library/jsonpatch.go``).

Owns ``jsonpatch.escapeKey``, the JSON Pointer helper of MutatingAdmissionPolicy. Must not import
the CEL runtime (only ``policies/cel/runtime.py`` may) and must not do I/O.
"""

from __future__ import annotations

from typing import Final

from policies.cel.library.declarations import FunctionSpec, function


def jsonpatch_escape_key(key: str) -> str:
    """``jsonpatch.escapeKey(string) -> string``: RFC 6901 (``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function(
        "jsonpatch.escapeKey",
        ("string_jsonpatch_escape_key", ["string"], "string", False, jsonpatch_escape_key),
    ),
)
"""The JSONPatch library's functions, as :mod:`~policies.cel.library.libraries` collects them."""
