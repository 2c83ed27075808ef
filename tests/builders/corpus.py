"""Loading the corpus copied into tests/data (real inputs from outside the project)."""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Iterator
from typing import Any

import yaml

from policies.facts.review import ReviewInput, from_object, from_request
from tests.paths import TESTS

DATA = TESTS / "data"


def documents(relative: str) -> list[dict[str, Any]]:
    """All non-empty YAML documents of one corpus file, e.g. ``manifests/x.yaml``."""
    with (DATA / relative).open(encoding="utf-8") as handle:
        return [d for d in yaml.safe_load_all(handle) if d is not None]


def first(relative: str, kind: str | None = None) -> dict[str, Any]:
    """The first document (of ``kind`` when given) of a corpus file, deep-copied for editing."""
    for document in documents(relative):
        if kind is None or document.get("kind") == kind:
            return copy.deepcopy(document)
    raise LookupError(f"{relative} has no {kind}")


def bug_input(name: str, key: str | None = None) -> dict[str, Any]:
    """The AdmissionReview (or named sub-case) under ``input`` of a bug case in tests/data/bugs."""
    case = documents(f"bugs/{name}")[0]
    review = case["input"] if key is None else case["input"][key]
    return copy.deepcopy(review)


def corpus_reviews(now: datetime.datetime) -> Iterator[tuple[str, ReviewInput]]:
    """(name, review) for every workload object of the corpus manifests and every corpus
    AdmissionReview that is an admission operation, judged at ``now``."""
    for path in sorted((DATA / "manifests").glob("*.yaml")):
        for index, doc in enumerate(documents(f"manifests/{path.name}")):
            if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
                yield f"{path.name}#{index}", from_object(doc, now=now)
    for path in sorted((DATA / "admissionreviews").glob("*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))
        request = body.get("request", body)
        if request.get("operation") in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
            yield path.name, from_request(request, now=now)
