"""Reading one field of parsed JSON / YAML data whose shape is not yet checked.

Owns the one narrowing rule: a field that is absent, null or not of the expected JSON type reads
as empty, so callers that report mis-typed fields elsewhere (the loaders, the workload and node
fact builders) can walk an object without guarding each step. Must not do I/O or report errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping (a JSON object), else a new empty dict."""
    if type(value) is dict:  # what JSON and YAML give: skip the slower ABC check
        return value
    return value if isinstance(value, Mapping) else {}


def mapping_at(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``parent[key]`` when it is a mapping (a JSON object), else a new empty dict."""
    return as_mapping(parent.get(key))
