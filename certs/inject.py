"""Set the caBundle in ValidatingWebhookConfiguration / MutatingWebhookConfiguration files.

Owns the in-place edit of YAML (or JSON) files: every ``webhooks[*].clientConfig.caBundle`` of
every webhook configuration in the file — several documents, ``kind: List`` — gets the new value.
Must not touch anything else in the file, read certificates (it is given the caBundle) or call the
Kubernetes API.

How: a targeted text edit, not a load-and-dump. The file is composed with PyYAML's safe composer,
which gives the character span of every node; only the span of each ``caBundle`` value is replaced
(keeping its quoting style), or, where a ``clientConfig`` has no ``caBundle``, one line
``caBundle: …`` is inserted as its first key at the same indentation (``caBundle: "…", `` after the
``{`` of a flow mapping or JSON object). Comments, key order, quoting, blank lines and every other
byte of the file stay as they were. The result is parsed again and compared with the original with
only the caBundles changed; any other difference is refused (the file is then left alone).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


class InjectError(Exception):
    """A file cannot be edited; ``str(error)`` is ``"<file>[:line]: [document N: ]<problem>"``."""


@dataclass(frozen=True)
class Injection:
    """The outcome of :func:`inject_ca_bundle` for one file.

    Attributes:
        text: the new file content (equal to the input when nothing changed).
        webhooks: every webhook set, as ``"<Kind>/<name>: <webhook name>"``, in file order.
        changed: the subset of ``webhooks`` whose caBundle was different or absent before.
    """

    text: str
    webhooks: tuple[str, ...]
    changed: tuple[str, ...]


@dataclass
class _Edit:
    start: int
    end: int
    replacement: str


def _pair(node: yaml.Node, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return key_node, value_node
    return None


def _scalar(node: yaml.Node, key: str) -> str | None:
    found = _pair(node, key)
    if found and isinstance(found[1], yaml.ScalarNode):
        return str(found[1].value)
    return None


def _objects(root: yaml.Node) -> Iterator[yaml.Node]:
    """The top-level object and, for ``kind: List``, its items."""
    kind = _scalar(root, "kind")
    items = _pair(root, "items")
    if kind is not None and kind.endswith("List") and items and isinstance(
        items[1], yaml.SequenceNode
    ):
        yield from items[1].value
    else:
        yield root


def _quoted(value: str, style: str | None) -> str:
    return f"'{value}'" if style == "'" else f'"{value}"'


def _replace_value(text: str, node: yaml.ScalarNode, value: str) -> _Edit:
    start, end = node.start_mark.index, node.end_mark.index
    if node.style in ('"', "'"):
        return _Edit(start, end, _quoted(value, node.style))
    if node.style in ("|", ">"):
        span = text[start:end]
        return _Edit(start, end, value + span[len(span.rstrip("\n")):])
    if start == end:  # empty value: "caBundle:" with nothing after the colon
        return _Edit(start, end, f" {value}" if text[start - 1:start] == ":" else value)
    return _Edit(start, end, value)


def _insert_key(text: str, mapping: yaml.MappingNode, value: str) -> _Edit:
    if mapping.flow_style or text[mapping.start_mark.index:mapping.start_mark.index + 1] == "{":
        at = mapping.start_mark.index + 1
        first_key = mapping.value[0][0] if mapping.value else None
        json_style = isinstance(first_key, yaml.ScalarNode) and first_key.style == '"'
        key = '"caBundle"' if json_style else "caBundle"
        separator = ", " if mapping.value else ""
        return _Edit(at, at, f'{key}: "{value}"{separator}')
    first_key = mapping.value[0][0]
    at = first_key.start_mark.index
    return _Edit(at, at, f"caBundle: {value}\n{' ' * first_key.start_mark.column}")


def _with_bundles(value: Any, ca_bundle: str) -> Any:
    """The parsed document with every webhook caBundle set (the expected result of the edit)."""
    if not isinstance(value, dict):
        return value
    kind = value.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(value.get("items"), list):
        return {**value, "items": [_with_bundles(item, ca_bundle) for item in value["items"]]}
    if kind not in WEBHOOK_KINDS or not isinstance(value.get("webhooks"), list):
        return value
    webhooks = []
    for webhook in value["webhooks"]:
        webhook = dict(webhook)
        webhook["clientConfig"] = {**webhook["clientConfig"], "caBundle": ca_bundle}
        webhooks.append(webhook)
    return {**value, "webhooks": webhooks}


def _compose(text: str, source: str) -> list[yaml.Node]:
    try:
        return [node for node in yaml.compose_all(text, Loader=yaml.SafeLoader)
                if node is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.context_mark or exc.problem_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = "; ".join(filter(None, (exc.context, exc.problem))) or str(exc)
        raise InjectError(f"{source}{line}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise InjectError(f"{source}: invalid YAML: {exc}") from None


def inject_ca_bundle(text: str, ca_bundle: str, source: str) -> Injection:
    """Set ``caBundle`` on every webhook of every webhook configuration in ``text``.

    Args:
        text: the file content (YAML, possibly several ``---`` documents, or JSON).
        ca_bundle: the base64 value (see :func:`certs.bundle.ca_bundle`).
        source: the file name, for messages.

    Returns:
        The :class:`Injection` (new text, webhooks set, webhooks changed).

    Raises:
        InjectError: invalid YAML; no webhook configuration in the file; ``webhooks`` not a list;
            a webhook without a ``clientConfig`` mapping; a ``caBundle`` that is not a string;
            or an edit that would change anything but caBundles (internal safety check).
        ValueError: ``ca_bundle`` is not base64.
    """
    if not _BASE64.match(ca_bundle):
        raise ValueError("ca_bundle: not a base64 string")
    edits: dict[tuple[int, int], _Edit] = {}
    webhooks: list[str] = []
    changed: list[str] = []
    found = False
    for index, root in enumerate(_compose(text, source)):
        for obj in _objects(root):
            kind = _scalar(obj, "kind")
            if kind not in WEBHOOK_KINDS:
                continue
            found = True
            metadata = _pair(obj, "metadata")
            name = (_scalar(metadata[1], "name") if metadata else None) or "(no name)"
            where = f"document {index}: {kind}/{name}"
            listed = _pair(obj, "webhooks")
            if listed is None or (isinstance(listed[1], yaml.ScalarNode)
                                  and listed[1].tag.endswith(":null")):
                continue  # a configuration without webhooks: nothing to set
            if not isinstance(listed[1], yaml.SequenceNode):
                line = listed[1].start_mark.line + 1
                raise InjectError(f"{source}:{line}: {where}: webhooks is not a list")
            for number, webhook in enumerate(listed[1].value):
                line = webhook.start_mark.line + 1
                hook = _scalar(webhook, "name") or f"webhooks[{number}]"
                label = f"{where}: webhooks[{number}] ({hook})"
                config = _pair(webhook, "clientConfig")
                if config is None:
                    raise InjectError(f"{source}:{line}: {label}: clientConfig is missing")
                if not isinstance(config[1], yaml.MappingNode):
                    line = config[1].start_mark.line + 1
                    raise InjectError(f"{source}:{line}: {label}: clientConfig is not a mapping")
                current = _pair(config[1], "caBundle")
                if current is None:
                    edit = _insert_key(text, config[1], ca_bundle)
                    is_change = True
                else:
                    node = current[1]
                    if not isinstance(node, yaml.ScalarNode) or not (
                        node.tag.endswith((":str", ":null"))
                    ):
                        line = node.start_mark.line + 1
                        raise InjectError(
                            f"{source}:{line}: {label}: clientConfig.caBundle is not a string"
                        )
                    edit = _replace_value(text, node, ca_bundle)
                    is_change = node.value != ca_bundle
                edits.setdefault((edit.start, edit.end), edit)
                entry = f"{kind}/{name}: {hook}"
                webhooks.append(entry)
                if is_change:
                    changed.append(entry)
    if not found:
        raise InjectError(f"{source}: no {' or '.join(WEBHOOK_KINDS)} found")
    new_text = text
    for edit in sorted(edits.values(), key=lambda e: e.start, reverse=True):
        if text[edit.start:edit.end] != edit.replacement:
            new_text = new_text[:edit.start] + edit.replacement + new_text[edit.end:]
    _check(text, new_text, ca_bundle, source)
    return Injection(new_text, tuple(webhooks), tuple(changed))


def _check(old: str, new: str, ca_bundle: str, source: str) -> None:
    """Refuse an edit whose parsed result differs from the original beyond the caBundles."""
    try:
        before = [_with_bundles(d, ca_bundle) for d in yaml.safe_load_all(old)]
        after = list(yaml.safe_load_all(new))
    except yaml.YAMLError as exc:
        raise InjectError(
            f"{source}: editing the caBundle would break the file ({exc}); file left unchanged"
        ) from None
    if before != after:
        raise InjectError(
            f"{source}: editing the caBundle would change more than the caBundle (an unusual "
            "layout, e.g. anchors); file left unchanged — set it by hand"
        )
