"""``gpuguard check``: evaluate policies offline on manifests or AdmissionReviews.

Each object (or AdmissionReview) is evaluated as the webhook would at admission — mutations first,
then validations on the mutated object — and the results per policy and rule are printed with the
JSONPatch. Exit codes: 0 all allowed, 1 some request would be denied, 2 bad input or policy files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuguard import policy_set
from gpuguard.settings import add_gpu_settings
from policies.engine import Engine, Verdict
from policies.resource_names import GPUSettings
from policies.review import ReviewError, ReviewInput, UserInfo, from_object, from_request
from policies.sources import Document, printable, read_documents


def parse_labels(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` into a dict.

    Raises:
        ValueError: an item without ``=`` or with an empty key.
    """
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--namespace-labels {text!r}: expected k=v[,k=v...], got {item!r}")
        labels[key] = value
    return labels


def _namespace_object(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


def _review(document: Document, args: argparse.Namespace, labels: Mapping[str, str],
            now: datetime.datetime) -> ReviewInput:
    body = document.body
    if body.get("kind") == "AdmissionReview":
        review = from_request(body.get("request"), now=now)
        namespace = review.namespace or args.namespace
        return ReviewInput(**{**review.__dict__,
                              "namespace_object": _namespace_object(namespace, labels)})
    metadata = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    namespace = str(metadata.get("namespace") or args.namespace)
    user = UserInfo(username=args.user, groups=tuple(args.group))
    review = from_object(body, user=user, now=now,
                         namespace_object=_namespace_object(namespace, labels))
    return ReviewInput(**{**review.__dict__, "namespace": review.namespace or namespace})


def _entry(document: Document, review: ReviewInput, verdict: Verdict) -> dict[str, Any]:
    return {
        "source": document.location,
        "kind": review.kind[2], "namespace": review.namespace, "name": review.name,
        "operation": review.operation,
        "allowed": verdict.allowed,
        "message": verdict.message,
        "warnings": list(verdict.warnings),
        "auditAnnotations": dict(verdict.audit_annotations),
        "patch": list(verdict.patch),
        "results": [r.to_dict() for r in verdict.results],
    }


def _print_table(entries: list[dict[str, Any]]) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    for entry in entries:
        decision = "[green]allowed[/]" if entry["allowed"] else "[red]DENIED[/]"
        title = f"{entry['kind']}/{entry['namespace'] or '-'}/{entry['name'] or '-'} " \
                f"({entry['source']})"
        console.print(f"{escape(printable(title))}: {decision}")
        table = Table(show_header=True, box=None, padding=(0, 2))
        for column in ("policy", "rule", "outcome", "message"):
            table.add_column(column, overflow="fold")
        for result in entry["results"]:
            if result["outcome"] == "pass":
                continue
            cells = (result["policy"], result["rule"], result["outcome"],
                     result["message"] if result["outcome"] != "mutate" else "")
            table.add_row(*(escape(printable(str(c))) for c in cells))
        if table.row_count:
            console.print(table)
        for warning in entry["warnings"]:
            console.print(f"  warning: {printable(warning)}", markup=False, highlight=False)
        if entry["patch"]:
            console.print("  patch: " + json.dumps(entry["patch"]), markup=False,
                          highlight=False)


def run(args: argparse.Namespace, settings: GPUSettings) -> int:
    """Evaluate the policies on every object under ``args.filename``; see module docstring."""
    try:
        labels = parse_labels(args.namespace_labels or "")
    except ValueError as exc:
        print(f"gpuguard: error: {exc}", file=sys.stderr)
        return 2
    loaded = policy_set.load(args.policies, settings)
    for error in loaded.errors:
        print(f"gpuguard: policy error: {error}", file=sys.stderr)
    if loaded.errors:
        return 2
    if not loaded.engine.policies.policies:
        # Evaluating nothing would allow everything: refuse rather than fail open.
        where = ", ".join(args.policies or ["the library"])
        print(f"gpuguard: error: no policies found in {where}", file=sys.stderr)
        return 2
    documents, errors = read_documents(args.filename)
    problems = [str(e) for e in errors]
    engine: Engine = loaded.engine
    now = datetime.datetime.now(datetime.UTC)
    entries = []
    for document in documents:
        try:
            review = _review(document, args, labels, now)
        except ReviewError as exc:
            problems.append(f"{document.location}: {exc}")
            continue
        entries.append(_entry(document, review, engine.evaluate(review)))
    for problem in problems:
        print(f"gpuguard: {problem}", file=sys.stderr)
    if args.output == "json":
        json.dump({"results": entries, "errors": problems}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_table(entries)
    if problems:
        return 2
    return 0 if all(e["allowed"] for e in entries) else 1


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard check``; returns (name, handler)."""
    parser = commands.add_parser(
        "check", help="evaluate policies offline on manifests or AdmissionReviews",
        description="Evaluate the policies (the built-in library unless --policies is given) on "
        "each object or AdmissionReview, as admission would: mutations, then validations. Exit 1 "
        "when a request would be denied.",
    )
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="PATH",
                        help="manifests or AdmissionReviews: file, directory or - (repeatable)")
    parser.add_argument("--policies", action="append", metavar="PATH",
                        help="policy file or directory (repeatable); default: built-in library")
    parser.add_argument("--namespace", default="default",
                        help="namespace for objects that name none (default: default)")
    parser.add_argument("--namespace-labels", metavar="K=V,...",
                        help="labels of the objects' namespace, for namespaceSelector and "
                        "namespaceObject")
    parser.add_argument("--user", default="", help="requesting user name (userInfo.username)")
    parser.add_argument("--group", action="append", default=[],
                        help="requesting user's group (repeatable)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    add_gpu_settings(parser)
    return "check", run
