"""No crash on any object shape (issue 13, item 4): every corpus object with random fields
deleted, nulled or retyped goes through the GPU facts, the CEL view of them, the engine with the
built-in library (as a bare object and as an AdmissionRequest) and the audit of a snapshot
holding it. Zero exceptions; a field the API server types, given a value of another type in a
GPU-relevant place, is reported naming its path.

Every seed is its own test case (``seed`` parametrized), so each corpus object is mutated in every
run. Deterministic in the normal run: the ``gpuguard-shapes`` hypothesis profile derandomizes
and gives each seed a few examples (:data:`EXAMPLES`). ``GPUGUARD_FUZZ=long`` selects
``gpuguard-shapes-long``: random, 100 times the examples (``GPUGUARD_FUZZ_SCALE`` sets the
factor).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import traceback
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.render import markdown as render_markdown
from audit.report import policy_reports
from audit.report.assemble import assemble
from audit.scan.scanner import scan
from audit.settings import AuditSettings
from gpuguard import policy_set
from policies.cel.gpu import GPU_FIELDS, gpu_data
from policies.cel.runtime import CelEvaluationError, prepare
from policies.engine.evaluation import Verdict
from policies.facts.identity import identity_problems
from policies.facts.nodes import node_facts
from policies.facts.resource_names import DEFAULT_SETTINGS
from policies.facts.review import ReviewError, UserInfo, from_object, from_request
from policies.facts.workloads import claim_templates_of, find_workload, workload_facts
from policies.sources import Document, LoadError
from tests.builders.object_shapes import (
    NODE_FIELDS,
    OBJECT_FIELDS,
    POD_SPEC_FIELDS,
    TEMPLATE_METADATA_FIELDS,
    VM_DOMAIN_FIELDS,
    Mutated,
    Seed,
    expected_reports,
    load_seeds,
    mutated,
    parse_path,
)

_LONG = os.environ.get("GPUGUARD_FUZZ") == "long"
_SCALE = int(os.environ.get("GPUGUARD_FUZZ_SCALE", "100")) if _LONG else 1
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("gpuguard-shapes", derandomize=True, deadline=None, database=None,
                          suppress_health_check=_HEALTH, print_blob=True)
settings.register_profile("gpuguard-shapes-long", derandomize=False, deadline=None,
                          suppress_health_check=_HEALTH, print_blob=True)
PROFILE = settings.get_profile("gpuguard-shapes-long" if _LONG else "gpuguard-shapes")
# Examples per seed and stage in the normal run: about 1,700 in all, ~10 s of CPU (the facts
# cost ~0.5 ms an example, the engine ~2 ms, the audit ~6 ms).
EXAMPLES = {"facts": 4, "engine": 3, "requests": 10, "audit": 2}


def examples(stage: str) -> settings:
    """The profile with the examples per seed of ``stage``."""
    return settings(PROFILE, max_examples=EXAMPLES[stage] * _SCALE)


SEEDS = load_seeds()
OBJECTS = tuple(s for s in SEEDS if not s.request)
REQUESTS = tuple(s for s in SEEDS if s.request)
ENGINE = policy_set.load(None, DEFAULT_SETTINGS).engine
NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
USER = UserInfo(username="alice", groups=("team-a",))
# A team namespace, restricted for sharing: every namespace-scoped library policy applies.
TEAM_LABELS = {"gpuguard.io/team": "a", "gpuguard.io/gpu-sharing": "restricted"}
NODE = {"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-node-1", "labels": {"nvidia.com/gpu.product":
                                                      "NVIDIA-A100-SXM4-80GB"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"}}}


def namespace_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Namespace the object is evaluated in (its own when it names one)."""
    metadata = body.get("metadata")
    name = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    name = name if isinstance(name, str) and name else "team-a"
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name,
                         "labels": {"kubernetes.io/metadata.name": name, **TEAM_LABELS}}}


def named(path: str, problems: tuple[str, ...] | list[str]) -> bool:
    """Whether some problem names ``path`` (as the field itself, not a longer sibling name)."""
    pattern = re.compile(r"(?:^|[\s('])" + re.escape(path) + r"(?:$|[:.\[\s)'])")
    return any(pattern.search(p) for p in problems)


# --- stages ---------------------------------------------------------------------------------


def check_facts(case: Mutated) -> None:
    """GPU facts (Node or workload), their JSON form and the CEL view; reported paths."""
    body = case.body
    if body.get("kind") == "Node":
        facts = node_facts(body)
        json.dumps(facts.to_dict())
        reported: tuple[str, ...] = facts.invalid
        anchors: list[tuple[Any, Any]] = [((), NODE_FIELDS)]
    else:
        claims = claim_templates_of([body, *case.seed.siblings])
        workload = workload_facts(body, claim_templates=claims)
        if workload is None:
            assert gpu_data(None).keys() == set(GPU_FIELDS)
            return
        json.dumps(workload.to_dict())
        view = gpu_data(workload)
        assert set(view) == set(GPU_FIELDS), case.describe()
        assert isinstance(view["equivalents"], float) and isinstance(view["count"], int)
        try:
            prepare({"object": body})
        except CelEvaluationError:
            pass  # the engine reports the object itself, naming the field (check_engine)
        else:
            prepare({"gpu": view})  # CEL data in, CEL data out
        reported = workload.total.invalid
        anchors = [((), OBJECT_FIELDS)]
        found = workload.workload
        if found.vm_domain_path is not None:
            anchors.append((parse_path(found.vm_domain_path), VM_DOMAIN_FIELDS))
        else:
            for template in found.templates:
                metadata = f"{template.path}.metadata" if template.path else "metadata"
                anchors += [((parse_path(template.spec_path)), POD_SPEC_FIELDS),
                            (parse_path(metadata), TEMPLATE_METADATA_FIELDS)]
                if template.path:
                    anchors.append((parse_path(template.path), (((), "map"),)))
    for names in expected_reports(body, case.edits, anchors):
        assert any(named(n, reported) for n in names), \
            f"{case.describe()}\nnot reported: {names[0]}\n{reported}"


_UNUSABLE = "the request cannot be evaluated: "
_DATA_PATH = re.compile(r"(object|oldObject|request|namespaceObject)[.\[:]")


def check_verdict(verdict: Verdict, case: Mutated) -> None:
    """A verdict from input alone: no internal error, serialisable."""
    for result in verdict.results:
        assert result.rule != "internal", f"{case.describe()}\n{result}"
        assert "could not be computed" not in result.message, f"{case.describe()}\n{result}"
        if result.message.startswith(_UNUSABLE):  # an input problem: it names the field
            assert _DATA_PATH.match(result.message, len(_UNUSABLE)), \
                f"{case.describe()}\n{result}"
    json.dumps([r.to_dict() for r in verdict.results])
    json.dumps(list(verdict.patch), default=str)


def check_engine(case: Mutated) -> None:
    """The built-in library on the object: at admission and audit, and as an AdmissionRequest."""
    body = case.body
    if case.seed.request:
        try:
            review = from_request(body, namespace_object=namespace_of({}), now=NOW)
        except ReviewError as exc:
            assert str(exc).startswith("request"), str(exc)
            return
        check_verdict(ENGINE.evaluate(review), case)
        return
    namespace = namespace_of(body)
    try:
        review = from_object(body, user=USER, namespace_object=namespace, now=NOW)
    except ReviewError as exc:
        # the one refusal of a bare object: a retyped kind or name field, named by its path
        assert identity_problems(body) and str(exc).startswith(("kind", "metadata")), str(exc)
    else:
        for point in ("admission", "audit"):
            check_verdict(ENGINE.evaluate(review, point=point), case)
    api_version = body.get("apiVersion")
    group, _, version = str(api_version).rpartition("/") if isinstance(api_version, str) \
        else ("", "", "v1")
    request = {"uid": "fuzz", "operation": "CREATE", "object": body,
               "kind": {"group": group, "version": version, "kind": body.get("kind")},
               "namespace": namespace["metadata"]["name"],
               "userInfo": {"username": "alice", "groups": ["team-a"]}}
    try:
        review = from_request(request, namespace_object=namespace, now=NOW)
    except ReviewError as exc:
        assert str(exc).startswith("request"), str(exc)
        return
    check_verdict(ENGINE.evaluate(review), case)


def check_audit(case: Mutated) -> None:
    """The audit of a snapshot holding the object, its file's other objects, its Namespace and a
    GPU node: it completes, and its JSON, Markdown and PolicyReports are written."""
    body = case.body
    if case.seed.request:
        body = body.get("object") if isinstance(body.get("object"), dict) else {}
    objects = [body if other is case.seed.body else other for other in case.seed.siblings] \
        if not case.seed.request else [body]
    items: list[Document | LoadError] = [
        Document("namespace", 0, None, namespace_of(body)), Document("node", 0, None, NODE)]
    for index, obj in enumerate(objects):
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if isinstance(kind, str) and kind:
            items.append(Document(case.seed.source, index, None, dict(obj)))
        else:  # what the file reader gives for it
            items.append(LoadError(case.seed.source, index, "object has no kind"))
    try:
        report = assemble(scan(items, AuditSettings(now=NOW), ENGINE))
    except Exception as exc:
        raise AssertionError(f"{case.describe()}\n{traceback.format_exc()}") from exc
    for error in report["errors"]:
        assert "cannot be audited" not in error, f"{case.describe()}\n{error}"
    for finding in report["findings"]:
        assert "evaluation failed" not in finding["message"], f"{case.describe()}\n{finding}"
    json.dumps(report)
    render_markdown.render(report)
    json.dumps(policy_reports.build(report))


# --- the properties -------------------------------------------------------------------------


def _ids(seeds: tuple[Seed, ...]) -> list[str]:
    counts: dict[str, int] = {}
    ids = []
    for seed in seeds:
        counts[seed.source] = counts.get(seed.source, -1) + 1
        ids.append(f"{seed.source}#{counts[seed.source]}")
    return ids


@pytest.mark.parametrize("seed", OBJECTS, ids=_ids(OBJECTS))
@examples("facts")
@given(data=st.data())
def test_mutated_objects_give_facts_not_crashes(seed: Seed, data: st.DataObject) -> None:
    case = data.draw(mutated((seed,)), label="case")
    try:
        check_facts(case)
    except CelEvaluationError as exc:
        raise AssertionError(f"{case.describe()}\nthe gpu view is not CEL data: {exc}") from exc


@pytest.mark.parametrize("seed", OBJECTS, ids=_ids(OBJECTS))
@examples("engine")
@given(data=st.data())
def test_mutated_objects_through_the_engine(seed: Seed, data: st.DataObject) -> None:
    check_engine(data.draw(mutated((seed,)), label="case"))


@pytest.mark.parametrize("seed", REQUESTS, ids=_ids(REQUESTS))
@examples("requests")
@given(data=st.data())
def test_mutated_admission_requests_through_the_engine(seed: Seed,
                                                       data: st.DataObject) -> None:
    check_engine(data.draw(mutated((seed,)), label="case"))


@pytest.mark.parametrize("seed", SEEDS, ids=_ids(SEEDS))
@examples("audit")
@given(data=st.data())
def test_mutated_objects_in_an_audit_snapshot(seed: Seed, data: st.DataObject) -> None:
    check_audit(data.draw(mutated((seed,)), label="case"))


def test_the_corpus_is_all_there() -> None:
    """Every seed directory contributes (the wild corpus included), unmutated objects pass."""
    sources = {s.source.split("/")[0] for s in SEEDS}
    assert sources == {"manifests", "nodes", "admissionreviews", "bugs", "wild", "edge"}
    assert len(OBJECTS) > 150 and len(REQUESTS) > 15
    for seed in SEEDS:
        case = Mutated(seed, dict(seed.body))
        if not seed.request:
            check_facts(case)
        check_engine(case)
    assert find_workload(next(s.body for s in OBJECTS if s.body.get("kind") ==
                              "VirtualMachineInstance")) is not None
