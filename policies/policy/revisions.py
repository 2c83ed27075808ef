"""What a new revision of the policy files removes from the documents of the previous one.

Owns :func:`document_identity` (how a policy-file document is named across revisions: what
``PolicySet.contents`` records) and :func:`lost_content`, the comparison a hot reload makes
before it serves a change: which documents that stay in the same file lost content — a field,
a list entry (a validation, a match rule), or the end of a string (a block-scalar CEL
expression cut at a line break). A file truncated at a line break, or half-written by a writer
that stalled, is still valid YAML more often than not, and it always reads as such a loss; an
edit that adds or changes content never does. The caller decides what a loss costs (the webhook
holds it for a longer quiet period); whole documents that vanish are
:func:`webhook.policy_store.lost_documents`'s.

Must not read files, the clock or compile anything: it compares parsed documents.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from policies.json_fields import mapping_at
from policies.sources import Document, Snapshot, SourceFile, file_documents

MAX_PATHS_SHOWN = 3


def document_identity(document: Document) -> str:
    """``Kind/name`` (``Kind/namespace/name`` when namespaced) of a policy-file document."""
    body = document.body
    metadata = mapping_at(body, "metadata")
    namespace = metadata.get("namespace")
    name = f"{namespace}/{metadata.get('name', '')}" if namespace else \
        str(metadata.get("name", ""))
    return f"{body.get('kind')}/{name}"


def _documents(file: SourceFile) -> dict[str, dict[str, Any]]:
    """Identity → body of every document of ``file`` that parses (the loader reports the
    rest: a broken file is refused before this comparison matters)."""
    found: dict[str, dict[str, Any]] = {}
    for document in file_documents(file):
        if isinstance(document, Document):
            found.setdefault(document_identity(document), document.body)
    return found


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def lost_paths(before: Any, after: Any, path: str = "") -> Iterator[str]:
    """Field paths (``spec.validations[1]``) of ``before`` that ``after`` no longer holds.

    A mapping key gone, a list's entries past the new length, or a string that became a
    proper prefix of itself (``"... (shortened)"``) are losses; a value that changed in any
    other way, or a type change, is an edit, not a loss. Yields in document order.
    """
    if isinstance(before, dict) and isinstance(after, dict):
        for key, value in before.items():
            where = _path(path, str(key))
            if key not in after:
                yield where
            else:
                yield from lost_paths(value, after[key], where)
    elif isinstance(before, list) and isinstance(after, list):
        for index, value in enumerate(before):
            if index >= len(after):
                yield _path(path, index)
            else:
                yield from lost_paths(value, after[index], _path(path, index))
    elif isinstance(before, str) and isinstance(after, str) and after != before and \
            before.startswith(after):
        yield f"{path} (shortened)"


def lost_content(before: Snapshot, after: Snapshot) -> list[str]:
    """One message per document that ``after`` keeps in the same file as ``before`` but with
    content removed (:func:`lost_paths`), naming the file, the document and the first
    :data:`MAX_PATHS_SHOWN` paths; empty when nothing was removed.

    Only files present in both with different bytes are parsed; documents that moved to
    another file or vanished are not this function's concern.
    """
    old = {file.path: file for file in before.files}
    messages: list[str] = []
    for file in after.files:
        previous = old.get(file.path)
        if previous is None or previous.data == file.data:
            continue
        new_documents = _documents(file)
        for identity, body in _documents(previous).items():
            if identity not in new_documents:
                continue
            paths = list(lost_paths(body, new_documents[identity]))
            if paths:
                messages.append(_message(file.path, identity, paths))
    return messages


def _message(source: str, identity: str, paths: Sequence[str]) -> str:
    shown = ", ".join(paths[:MAX_PATHS_SHOWN])
    more = len(paths) - MAX_PATHS_SHOWN
    return f"{source}: {identity} loses {shown}" + (f" and {more} more" if more > 0 else "")
