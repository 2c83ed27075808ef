"""JSON Patch as kube-apiserver applies it: ``gopkg.in/evanphx/json-patch.v4`` (v4.13.0, what
k8s.io/apiserver 1.37 uses for MutatingAdmissionPolicy ``JSONPatch`` mutations), ported.

Owns the library's semantics where they differ from RFC 6902, and its error texts (which the API
server returns as ``JSON Patch: <text>``):

* a path is split on ``/`` and its first segment dropped, so ``metadata/labels`` names the root
  key ``labels``, and a path without a ``/`` (``c``) is ``doc is missing path``;
* array indexes may be negative (``/spec/containers/-1`` is the last container) and ``-``
  appends; ``replace`` of a map key that does not exist adds it;
* ``add`` without a ``value`` adds null; a ``test`` that fails raises
  :class:`PatchTestFailed`, which the API server takes as "do not apply this patch" (the object
  is admitted unchanged), not as an error.

Values are JSON data (dict, list, str, int, float, bool, None). Must not decide what a failed
patch means for a request (the engine does) nor check the result's types
(:mod:`policies.policy.decoding`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

_ESCAPE = re.compile("~[01]")
_MISSING: Final = "missing value"
_INVALID_INDEX: Final = "invalid index referenced"
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)


class PatchError(ValueError):
    """An operation does not apply; ``str()`` is the library's text, ``index`` the operation's
    position in the patch (-1 until :func:`apply_patch` sets it)."""

    index: int = -1


class PatchTestFailed(PatchError):
    """A ``test`` operation did not hold (``testing value /x failed: test failed``)."""


def _key(part: str) -> str:
    """RFC 6901 unescaping in one pass (``~01`` is ``~1``), as Go's ``strings.Replacer``."""
    return _ESCAPE.sub(lambda m: "/" if m[0] == "~1" else "~", part)


def _atoi(key: str) -> int:
    """Go ``strconv.Atoi``.

    Raises:
        PatchError: Go's ``strconv.Atoi: parsing "x": invalid syntax``.
    """
    if not _INTEGER.fullmatch(key):
        raise PatchError(f'strconv.Atoi: parsing "{key}": invalid syntax')
    value = int(key)
    if not -(2**63) <= value < 2**63:
        raise PatchError(f'strconv.Atoi: parsing "{key}": value out of range')
    return value


def _index(container: list[Any], key: str, size: int) -> int:
    """A (possibly negative) index below ``size``.

    Raises:
        PatchError: not an integer, or outside ``[-size, size)``.
    """
    index = _atoi(key)
    if index >= size or index < -size:
        raise PatchError(f"Unable to access invalid index: {index}: {_INVALID_INDEX}")
    return index + size if index < 0 else index


def _get(container: Any, key: str) -> Any:
    """The value at ``key``; a missing map key is None (the library cannot tell it from null).

    Raises:
        PatchError: an array index that is not an integer or is out of range.
    """
    if isinstance(container, dict):
        return container.get(key)
    return container[_index(container, key, len(container))]


def _add(container: Any, key: str, value: Any) -> None:
    if isinstance(container, dict):
        container[key] = value
        return
    if key == "-":
        container.append(value)
        return
    try:
        index = _atoi(key)
    except PatchError as exc:
        raise PatchError(f"value was not a proper array index: '{key}': {exc}") from None
    size = len(container) + 1
    if index >= size or index < -size:
        raise PatchError(f"Unable to access invalid index: {index}: {_INVALID_INDEX}")
    container.insert(index + size if index < 0 else index, value)


def _remove(container: Any, key: str) -> None:
    if isinstance(container, dict):
        if key not in container:
            raise PatchError(f"Unable to remove nonexistent key: {key}: {_MISSING}")
        del container[key]
        return
    del container[_index(container, key, len(container))]


def _parent(document: Any, path: str) -> tuple[Any, str] | None:
    """The container holding ``path``'s last segment and that segment (``findObject``); None
    where a segment on the way is missing, null, a scalar or a bad index."""
    parts = path.split("/")
    if len(parts) < 2:
        return None
    container = document
    for part in parts[1:-1]:
        try:
            container = _get(container, _key(part))
        except PatchError:
            return None
        if not isinstance(container, dict | list):
            return None
    return container, _key(parts[-1])


def _equal(left: Any, right: Any) -> bool:
    """The library's structural equality: maps and arrays by content, scalars by their JSON
    text. Both sides are Go-marshalled numbers there (the value through ``structpb.Value``), so
    ``1`` and ``1.0`` are equal; ``true`` and ``1`` are not."""
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_equal(v, right[k]) for k, v in left.items())
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_equal, left, right))
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    return type(left) is type(right) and left == right


def apply_patch(document: Mapping[str, Any], operations: Sequence[Mapping[str, Any]]
                ) -> dict[str, Any] | list[Any]:
    """Apply ``operations`` (maps with ``op``, ``path`` and, when given, ``from`` and
    ``value``) to a deep copy of ``document``; the patch applies whole or not at all.

    Raises:
        PatchTestFailed: a ``test`` operation did not hold.
        PatchError: an operation does not apply (``remove operation does not apply: doc is
            missing path: "/x": missing value``, ``Unexpected kind: bogus``).
    """
    root: Any = copy.deepcopy(dict(document))
    for index, operation in enumerate(operations):
        kind = operation.get("op")
        kind = kind if isinstance(kind, str) else "unknown"
        step = _STEPS.get(kind)
        try:
            if step is None:
                raise PatchError(f"Unexpected kind: {kind}")
            root = step(root, operation)
        except PatchError as exc:
            exc.index = index
            raise
    return root  # type: ignore[no-any-return]


def _path(operation: Mapping[str, Any], field: str = "path") -> str | None:
    value = operation.get(field)
    return value if isinstance(value, str) else None


def _required(operation: Mapping[str, Any], undecoded: str) -> str:
    """The operation's ``path``; ``undecoded``: the library's text when it has none (it
    differs by op)."""
    path = _path(operation)
    if path is None:
        raise PatchError(undecoded)
    return path


def _op_add(root: Any, operation: Mapping[str, Any]) -> Any:
    path = _required(operation, f"add operation failed to decode path: {_MISSING}")
    found = _parent(root, path)
    if found is None:
        raise PatchError(f'add operation does not apply: doc is missing path: "{path}": '
                         f"{_MISSING}")
    try:
        _add(*found, copy.deepcopy(operation.get("value")))
    except PatchError as exc:
        raise PatchError(f"error in add for path: '{path}': {exc}") from None
    return root


def _op_remove(root: Any, operation: Mapping[str, Any]) -> Any:
    path = _required(operation, f"remove operation failed to decode path: {_MISSING}")
    found = _parent(root, path)
    if found is None:
        raise PatchError(f'remove operation does not apply: doc is missing path: "{path}": '
                         f"{_MISSING}")
    try:
        _remove(*found)
    except PatchError as exc:
        raise PatchError(f"error in remove for path: '{path}': {exc}") from None
    return root


def _op_replace(root: Any, operation: Mapping[str, Any]) -> Any:
    path = _required(operation, "replace operation failed to decode path: operation missing "
                                f"path field: {_MISSING}")
    if path == "":
        value = operation.get("value")
        if not isinstance(value, dict | list):
            raise PatchError("replace operation value must be object or array: %!w(<nil>)")
        return copy.deepcopy(value)
    found = _parent(root, path)
    if found is None:
        raise PatchError(f"replace operation does not apply: doc is missing path: {path}: "
                         f"{_MISSING}")
    container, key = found
    try:
        _get(container, key)
    except PatchError:
        raise PatchError(f"replace operation does not apply: doc is missing key: {path}: "
                         f"{_MISSING}") from None
    if isinstance(container, dict):
        container[key] = copy.deepcopy(operation.get("value"))
    else:
        container[_index(container, key, len(container))] = copy.deepcopy(operation.get("value"))
    return root


def _source(root: Any, operation: Mapping[str, Any], kind: str) -> tuple[Any, str, str]:
    """The container and key of a move's or copy's ``from``, and the ``from`` itself."""
    source = _path(operation, "from")
    if source is None:
        raise PatchError(f"{kind} operation failed to decode from: operation, missing from "
                         f"field: {_MISSING}")
    found = _parent(root, source)
    if found is None:
        raise PatchError(f"{kind} operation does not apply: doc is missing from path: {source}: "
                         f"{_MISSING}")
    return (*found, source)


def _destination(root: Any, operation: Mapping[str, Any], kind: str,
                 undecoded: str) -> tuple[Any, str, str]:
    """The container and key of a move's or copy's ``path``, and the path itself
    (``undecoded``: the library's text when there is none, which differs by op)."""
    path = _required(operation, undecoded)
    found = _parent(root, path)
    if found is None:
        raise PatchError(f"{kind} operation does not apply: doc is missing destination path: "
                         f"{path}: {_MISSING}")
    return (*found, path)


def _op_move(root: Any, operation: Mapping[str, Any]) -> Any:
    container, key, _ = _source(root, operation, "move")
    try:
        value = _get(container, key)
        _remove(container, key)
    except PatchError as exc:
        raise PatchError(f"error in move for path: '{key}': {exc}") from None
    target, name, path = _destination(
        root, operation, "move",
        f"move operation failed to decode path: operation missing path field: {_MISSING}")
    try:
        _add(target, name, value)
    except PatchError as exc:
        raise PatchError(f"error in move for path: '{path}': {exc}") from None
    return root


def _op_copy(root: Any, operation: Mapping[str, Any]) -> Any:
    container, key, source = _source(root, operation, "copy")
    try:
        value = _get(container, key)
    except PatchError as exc:
        raise PatchError(f"error in copy for from: '{source}': {exc}") from None
    target, name, _ = _destination(root, operation, "copy",
                                   f"copy operation failed to decode path: {_MISSING}")
    try:
        _add(target, name, copy.deepcopy(value))
    except PatchError as exc:
        raise PatchError(f"error while adding value during copy: {exc}") from None
    return root


def _op_test(root: Any, operation: Mapping[str, Any]) -> Any:
    path = _required(operation, "test operation failed to decode path: operation missing "
                                f"path field: {_MISSING}")
    failed = PatchTestFailed(f"testing value {path} failed: test failed")
    if path == "":
        if "value" in operation and _equal(root, operation["value"]):
            return root
        raise failed
    found = _parent(root, path)
    if found is None:
        raise PatchError(f"test operation does not apply: is missing path: {path}: {_MISSING}")
    try:
        value = _get(*found)
    except PatchError as exc:
        raise PatchError(f"error in test for path: '{path}': {exc}") from None
    if value is None:  # missing or null in the document
        if "value" not in operation:  # the API server omits a JSONPatch's unset value
            return root
        raise failed  # even value: null (its raw JSON is "null", not nil)
    if "value" not in operation or not _equal(value, operation["value"]):
        raise failed
    return root


_STEPS: Final = {"add": _op_add, "remove": _op_remove, "replace": _op_replace, "move": _op_move,
                 "copy": _op_copy, "test": _op_test}
