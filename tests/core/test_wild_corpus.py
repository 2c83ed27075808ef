"""Every manifest of the wild corpus (``tests/data/wild``, issue 16) counted as EXPECTED.yaml says.

``tests/data/wild`` is a copy of ``../shared/corpus/wild``: 64 public GPU manifests from 18 projects
and ``EXPECTED.yaml``, the truth per file computed by hand *before* gpuguard was run on them. Each
file is run through :func:`gpuguard.gpus_command.collect` — what ``gpuguard gpus -o json`` prints,
i.e. :func:`policies.facts.workloads.workload_facts` with the claim / DeviceClass index of the same
input — and compared field by field.

``tests/data/wild-harvest`` is the same for 20 more real manifests from 15 projects not in the
wild corpus' INDEX.tsv, harvested (and their EXPECTED.yaml written and committed before gpuguard
ran) by someone who did not write gpuguard's fixes; what gpuguard got wrong there is in its
``FOUND-2026-12-02.tsv`` and marked ``xfail(strict=True)`` below (:data:`HARVEST_FAULTS`), so a fix
turns the case into a failure that asks for the mark to go.

EXPECTED.yaml is hand-written and semi-structured; :class:`_Reader` is the one explicit reading of
its fields (numbers followed by prose, ``(generateName …)`` names, ``raw`` strings). The reading:

- ``kind``: the first word (``"Job (batch.volcano.sh)"`` is kind Job; the parenthesis names the
  API group, checked against ``apiVersion`` when it contains a ``.``).
- ``name``: compared as written; ``"(generateName X)"`` is compared with X (gpuguard names an
  object by ``generateName`` when it has no name); ``"(generateName)"`` is not compared.
- ``replicas`` / ``pods``: pods of the workload, gpuguard's ``replicas``; ``per-node`` is None.
  Where the entry also gives ``size`` (LeaderWorkerSet) or ``pods``, ``replicas`` is the object's
  own ``spec.replicas`` (groups), and ``pods`` (or replicas x size) is compared instead.
- ``per_pod`` / ``total`` / ``per_node``: resource -> the leading integer of the value
  (``"1 (MPS replica)"`` is 1), compared with ``effective_requests`` (every GPU-related resource
  as Kubernetes computes the pod's request). A name gpuguard does not know is accepted when it is
  listed in ``unrecognized`` — the file's note says "should at least be listed as unrecognized".
- ``total_gpus``: devices = Σ ``gpus`` + Σ ``mig`` + DRA devices; a leading number followed by
  prose is the number. File-level ``total_gpus`` (claims shared across pods) is summed over the
  file's workloads with each shared ResourceClaim (``dra.claims[].resource_claim``) counted once.
- ``geq`` / ``total_geq``: ``total.gpu_equivalents`` within 1e-6; ``null`` means it must be None
  (``unknown`` says why); a string is its leading number, except that a string saying "unknown
  from the manifest alone" also accepts None.
- ``shared``: ``total.shared``; a string is True unless it says "exclusive".
- ``templates``: matched by ``role``; ``replicas`` a number, or the number after ``=`` of
  ``"1 x parallelism 2 = 2 pods"``; ``pods`` the template's pods; ``size`` (DisaggregatedSet
  roles) is the template's pods; ``min`` / ``max`` the template's bounds.
- ``dra``: ``claims`` the number of pod claims, ``count`` the devices, ``template`` /
  ``device_class`` / ``resourceClaimName`` their first word.
- ``ignored``: each ``Kind[/name]`` is in ``ignored``.
- ``workloads: []``: no object asks for a GPU; a note saying "Not valid YAML" wants an error naming
  the file.
- ``node``: allocatable whole GPUs and MIG instances, GPU-equivalents.
- notes, ``real_device``, ``max_clients``, ``min_total``/``max_total`` prose fields are documentation
  except where listed here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from gpuguard.gpus_command import collect
from policies.facts.resource_names import DEFAULT_SETTINGS
from tests.paths import TESTS

DATA = TESTS / "data"
# Each corpus folder with its number of manifests; each has its own EXPECTED.yaml (same schema).
CORPORA: dict[str, int] = {"wild": 64, "wild-harvest": 20}
EXPECTED: dict[str, dict[str, Any]] = {
    corpus: yaml.safe_load((DATA / corpus / "EXPECTED.yaml").read_text(encoding="utf-8"))
    for corpus in CORPORA
}
FILES: dict[str, list[str]] = {
    corpus: sorted(p.name for p in (DATA / corpus).glob("*.yaml") if p.name != "EXPECTED.yaml")
    for corpus in CORPORA
}
# A file whose truth needs an object published in another file of the corpus (the note says so).
COMPANIONS = {
    "kubevirt_kubevirt__examples-vm-dra-pgpu.yaml": "kubevirt_kubevirt__examples-pgpu-resource-claim-tmpl.yaml",
}
# Where gpuguard's answer differs from EXPECTED.yaml on purpose: (file, check) -> (gpuguard's
# value, asserted instead of EXPECTED's, and the argument).
DISAGREEMENTS: dict[tuple[str, str], tuple[Any, str]] = {
    ("Project-HAMi_HAMi__examples-ascend-job-910B3.yaml", "Pod/ascend910b3-job geq"): (
        None,
        "EXPECTED writes '1 NPU (vNPU slice by memory)': HAMi's Ascend vNPU allocates a template "
        "slice chosen by huawei.com/Ascend910B3-memory (2000 MiB here), not a whole NPU; its "
        "share of the NPU depends on the card's memory, so gpuguard says unknown (with the "
        "reason) rather than 1 GPU-equivalent, which would over-count a small slice 30-fold.",
    ),
    ("kubernetes-sigs_dra-example-driver__demo-examples-extended-resource-request-"
     "extended-resource-request.yaml", "Pod/pod1 GPU devices"): (
        0,
        "example.com/gpu is the dra-example-driver's DeviceClass extendedResourceName, but that "
        "DeviceClass is not in the file: from the file alone it is an unknown name, so gpuguard "
        "lists it as unrecognized with its path (spec.containers[0].resources.limits) and counts "
        "no device, as EXPECTED's note allows ('should at least be listed as unrecognized'). With "
        "the DeviceClass in the input it counts 1 (tests/core/test_dra.py).",
    ),
}

# What gpuguard gets wrong on the harvest (tests/data/wild-harvest/FOUND-2026-12-02.tsv, one line
# each there): file -> the fault, marked xfail(strict=True) until fixed. The four of 2026-12-02
# (NIMService draResources, KAITO Workspace / InferenceSet resource.mig, DisaggregatedSet
# spec.slices) are fixed: the kinds are in policies.facts.workload_kinds and the FOUND file says
# where each was fixed.
HARVEST_FAULTS: dict[str, str] = {}

_LEADING = re.compile(r"\s*([-+]?\d+(?:\.\d+)?)")


def _number(value: Any) -> float | None:
    """The leading number of ``value`` (``"1 NPU"`` is 1; ``3`` is 3); None when it has none."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    found = _LEADING.match(str(value))
    return float(found.group(1)) if found else None


def _count(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _counts(mapping: Mapping[str, Any]) -> dict[str, int]:
    return {str(k): int(_number(v) or 0) for k, v in mapping.items()}


def _raw_entry(text: str) -> dict[str, Any]:
    """A ``raw`` workload (prose YAML cannot parse): its kind, name and total_gpus."""
    entry: dict[str, Any] = {}
    for key in ("kind", "name", "total_gpus"):
        found = re.search(rf"\b{key}: ([^,}}]+)", text)
        if found:
            entry[key] = found.group(1).strip()
    return entry


def _devices(facts: Mapping[str, Any]) -> int | None:
    """Devices a facts object asks for: whole + MIG + DRA (None when DRA's count is unknown)."""
    dra = facts.get("dra")
    dra_gpus = 0 if dra is None else dra["gpus"]
    if dra_gpus is None:
        return None
    return sum(facts["gpus"].values()) + sum(facts["mig"].values()) + dra_gpus


class _Reader:
    """Compares one EXPECTED.yaml entry with gpuguard's result; collects every mismatch."""

    def __init__(self, file: str, result: dict[str, Any]) -> None:
        self.file = file
        self.result = result
        self.problems: list[str] = []

    def expect(self, what: str, want: Any, got: Any) -> None:
        if (self.file, what) in DISAGREEMENTS:
            want = DISAGREEMENTS[(self.file, what)][0]
        if want != got:
            self.problems.append(f"{what}: expected {want!r}, gpuguard says {got!r}")

    def expect_geq(self, what: str, want: Any, got: float | None) -> None:
        if (self.file, what) in DISAGREEMENTS:
            self.expect(what, None, got)  # the argued value replaces EXPECTED's
            return
        if want is None:
            self.expect(what, None, got)
            return
        number = _number(want)
        if isinstance(want, str) and "unknown from the manifest alone" in want and got is None:
            return
        if number is None:
            return  # prose only ("HAMi split ...") says nothing checkable
        if got is None or abs(got - number) > 1e-6:
            self.problems.append(f"{what}: expected {number}, gpuguard says {got!r}")

    def expect_resources(self, what: str, want: Mapping[str, Any], facts: Mapping[str, Any]) -> None:
        got = facts["effective_requests"]
        for resource, count in _counts(want).items():
            if got.get(resource) == count:
                continue
            if resource not in got and resource in facts["unrecognized"]:
                continue  # not a name gpuguard knows, and it says so
            if resource not in got and any(p["resource"] == resource
                                           for p in facts["resource_problems"]):
                continue  # rejected by the API server (obsolete name): reported, not counted
            self.problems.append(f"{what}[{resource}]: expected {count}, gpuguard says "
                                 f"{got.get(resource)!r} (unrecognized: {facts['unrecognized']})")

    def find(self, entry: Mapping[str, Any], used: set[int]) -> dict[str, Any] | None:
        kind = str(entry.get("kind", "")).split()[0] if entry.get("kind") else None
        name = self.name_of(entry)
        for index, obj in enumerate(self.result["objects"]):
            if index in used or obj["kind"] == "Node":
                continue
            if (kind is None or obj["kind"] == kind) and (name is None or obj["name"] == name):
                used.add(index)
                return obj
        self.problems.append(f"no object {kind}/{name} among "
                             f"{[(o['kind'], o['name']) for o in self.result['objects']]}")
        return None

    @staticmethod
    def name_of(entry: Mapping[str, Any]) -> str | None:
        name = entry.get("name")
        if not isinstance(name, str):
            return None
        if name.startswith("("):
            words = name.strip("()").split()
            return words[1] if len(words) > 1 and words[0] == "generateName" else None
        return name

    def workload(self, entry: Mapping[str, Any], obj: dict[str, Any]) -> None:
        label = f"{obj['kind']}/{obj['name']}"
        total = obj["total"]
        kind_text = str(entry.get("kind", ""))
        group = re.search(r"\(([a-z0-9.-]+\.[a-z]+)", kind_text)
        if group:
            self.expect(f"{label} apiVersion group", group.group(1),
                        obj["apiVersion"].split("/")[0])
        pods = entry.get("pods")
        if "size" in entry and pods is None:
            pods = (_count(entry.get("replicas")) or 1) * (_count(entry["size"]) or 0)
        if pods is not None:
            self.expect(f"{label} pods", _count(pods), obj["replicas"])
        elif "replicas" in entry:
            want = None if entry["replicas"] == "per-node" else _count(entry["replicas"])
            self.expect(f"{label} replicas", want, obj["replicas"])
        if "per_pod" in entry:
            per_pod = obj["per_pod"] or (obj["templates"][0]["per_pod"] if obj["templates"]
                                         else None)
            if per_pod is None:
                self.problems.append(f"{label}: no per-pod facts")
            else:
                self.expect_resources(f"{label} per_pod", entry["per_pod"] or {}, per_pod)
        for key in ("total", "per_node", "total_if_list"):
            if key in entry:
                want = _counts(entry[key])
                if key == "per_node":  # TrainJob: per node x numNodes
                    want = {r: c * (_count(entry.get("numNodes")) or 1) for r, c in want.items()}
                self.expect_resources(f"{label} {key}", want, total)
        if "total_if_list" in entry:
            self.expect(f"{label} reports the broken shape", True, bool(total["invalid"]))
        if "total_gpus" in entry:
            want_gpus = _count(entry["total_gpus"])
            self.expect(f"{label} GPU devices", want_gpus, _devices(total))
            if isinstance(entry["total_gpus"], str) and "invalid" in entry["total_gpus"]:
                self.expect(f"{label} reported invalid", True, bool(total["invalid"]))
        for key in ("geq", "total_geq"):
            if key in entry:
                self.expect_geq(f"{label} {key}", entry[key], total["gpu_equivalents"])
        if "shared" in entry:
            want_shared = entry["shared"]
            if isinstance(want_shared, str):
                want_shared = "exclusive" not in want_shared
            self.expect(f"{label} shared", want_shared, total["shared"])
        if "gpu_memory_mib" in entry:
            self.expect(f"{label} gpu_memory_mib", entry["gpu_memory_mib"],
                        total["gpu_memory_mib"])
        if "mig" in entry:
            self.expect(f"{label} mig", _counts(entry["mig"]), total["mig"])
        if "kai" in entry:
            self.expect(f"{label} kai fraction", entry["kai"].get("fraction"),
                        (obj["templates"][-1]["per_pod"]["kai"] or {}).get("fraction"))
        if "requested" in entry:
            self.expect(f"{label} requested", entry["requested"], total["requested"])
        if "privileged" in entry:
            self.expect(f"{label} privileged containers", sorted(entry["privileged"]),
                        sorted({a["container"] for a in total["privileged"]}))
        if "unrequested_access" in entry:
            reasons = " ".join(a["reason"] for a in total["unrequested_access"])
            for word in entry["unrequested_access"]:
                if str(word).split("=")[0] not in reasons:
                    self.problems.append(f"{label} unrequested access {word!r} not in {reasons!r}")
        if "dra" in entry and isinstance(entry["dra"], Mapping):
            self.dra(label, entry["dra"], total)
        for template in entry.get("templates") or ():
            self.template(label, template, obj)

    def dra(self, label: str, want: Mapping[str, Any], total: Mapping[str, Any]) -> None:
        dra = total.get("dra") or {"claims": [], "gpus": 0}
        claims = dra["claims"]
        if "claims" in want:
            # A claim for a device that is NOT a GPU (an IMEX channel) is no GPU claim.
            gpu_claims = 0 if "NOT a GPU" in str(want) else _count(want["claims"])
            self.expect(f"{label} DRA GPU claims", gpu_claims, len(claims))
        if isinstance(want.get("count"), int) and "firstAvailable" not in want \
                and not str(want.get("template", "")).endswith("x2"):
            self.expect(f"{label} DRA devices", want["count"], dra["gpus"])
        if "firstAvailable" in want:
            self.expect(f"{label} DRA devices (firstAvailable: one)", 1, dra["gpus"])
        for key, name in (("template", "template"), ("device_class", "device_class"),
                          ("resourceClaimName", "resource_claim")):
            if isinstance(want.get(key), str) and claims:
                self.expect(f"{label} DRA {key}", want[key].split()[0], claims[0].get(name))

    def template(self, label: str, want: Mapping[str, Any], obj: Mapping[str, Any]) -> None:
        role = str(want.get("role"))
        found = [t for t in obj["templates"] if t["role"] == role]
        if not found:
            self.problems.append(f"{label}: no template with role {role!r} among "
                                 f"{[t['role'] for t in obj['templates']]}")
            return
        template = found[0]
        replicas = want.get("pods", want.get("size", want.get("replicas")))
        if isinstance(replicas, str) and "=" in replicas:
            replicas = replicas.rsplit("=", 1)[1]
        if "numOfHosts" in want and "pods" not in want:
            replicas = (_count(replicas) or 0) * (_count(want["numOfHosts"]) or 0)
        if replicas is not None:
            self.expect(f"{label} {role} pods", _count(replicas), template["replicas"])
        for key, name in (("min", "min_replicas"), ("max", "max_replicas")):
            if key in want:
                self.expect(f"{label} {role} {name}", want[key], template[name])
        if "per_pod" in want:
            self.expect_resources(f"{label} {role} per_pod", want["per_pod"] or {},
                                  template["per_pod"])
        if "kai" in want:
            self.expect(f"{label} {role} kai fraction", want["kai"].get("fraction"),
                        (template["per_pod"]["kai"] or {}).get("fraction"))

    def node(self, want: Mapping[str, Any]) -> None:
        nodes = [o for o in self.result["objects"] if o["kind"] == "Node"]
        if len(nodes) != 1:
            self.problems.append(f"expected one Node, gpuguard found {len(nodes)}")
            return
        facts = nodes[0]["node"]
        self.expect("node name", want["name"], nodes[0]["name"])
        allocatable = _counts({k: v for k, v in want["allocatable"].items() if k != "mig"})
        self.expect("node allocatable GPUs", allocatable, facts["allocatable"]["gpus"])
        self.expect("node allocatable MIG", _counts(want["allocatable"]["mig"]),
                    facts["allocatable"]["mig"])
        self.expect_geq("node GPU-equivalents", want["gpu_equivalents_allocatable"],
                        facts["gpu_equivalents_allocatable"])

    def file_totals(self, expected: Mapping[str, Any]) -> None:
        """File-level ``total_gpus`` / ``geq``: claims shared by several pods counted once."""
        seen: set[tuple[str | None, str]] = set()
        devices = 0
        for obj in self.result["objects"]:
            if obj["kind"] == "Node" or not obj["total"]["requested"]:
                continue
            total = obj["total"]
            devices += sum(total["gpus"].values()) + sum(total["mig"].values())
            for claim in (total.get("dra") or {}).get("claims", ()):
                shared = claim.get("resource_claim")
                if shared is not None:
                    if (obj["namespace"], shared) in seen:
                        continue
                    seen.add((obj["namespace"], shared))
                devices += claim["count"] or 0
        if "total_gpus" in expected:
            self.expect("file GPU devices (shared claims once)", _count(expected["total_gpus"]),
                        devices)
        if "geq" in expected:
            geqs = [o["total"]["gpu_equivalents"] for o in self.result["objects"]
                    if o["kind"] != "Node" and o["total"]["requested"]]
            self.expect_geq("file GPU-equivalents", expected["geq"],
                            None if None in geqs else sum(geqs))

    def check(self, expected: Mapping[str, Any]) -> list[str]:
        if "node" in expected:
            self.node(expected["node"])
            return self.problems
        entries = [_raw_entry(e["raw"]) if "raw" in e else e
                   for e in expected.get("workloads") or ()]
        used: set[int] = set()
        for entry in entries:
            obj = self.find(entry, used)
            if obj is not None:
                self.workload(entry, obj)
        phantom = [f"{o['kind']}/{o['name']}" for i, o in enumerate(self.result["objects"])
                   if i not in used and o["kind"] != "Node" and o["total"]["requested"]]
        self.expect("workloads asking for GPUs that EXPECTED.yaml does not list", [], phantom)
        if not entries and "Not valid YAML" in str(expected.get("notes")):
            named = [e for e in self.result["errors"] if self.file in e]
            self.expect("an error naming the file", True, bool(named))
        for ignored in expected.get("ignored") or ():
            if not any(i == ignored or i.startswith(f"{ignored}/")
                       for i in self.result["ignored"]):
                self.problems.append(f"{ignored} not in ignored {self.result['ignored']}")
        self.file_totals(expected)
        return self.problems


@pytest.mark.parametrize("corpus", CORPORA)
def test_the_copy_is_the_whole_corpus(corpus: str) -> None:
    """Every manifest has its hand-computed truth, and no truth is without a manifest."""
    assert len(FILES[corpus]) == CORPORA[corpus]
    assert sorted(EXPECTED[corpus]) == FILES[corpus]


def _case(corpus: str, file: str) -> Any:
    fault = HARVEST_FAULTS.get(file) if corpus == "wild-harvest" else None
    marks = [pytest.mark.xfail(strict=True, reason=f"gpuguard wrong: {fault}")] if fault else []
    return pytest.param(corpus, file, id=f"{corpus}/{file}", marks=marks)


@pytest.mark.parametrize(("corpus", "file"),
                         [_case(corpus, file) for corpus in CORPORA for file in FILES[corpus]])
def test_counted_as_expected(corpus: str, file: str) -> None:
    """gpuguard's count of one corpus file equals EXPECTED.yaml's (or the disagreement is argued)."""
    folder = DATA / corpus
    paths = [str(folder / file)] + ([str(folder / COMPANIONS[file])] if file in COMPANIONS else [])
    result = collect(paths, DEFAULT_SETTINGS)
    problems = _Reader(file, result).check(EXPECTED[corpus][file])
    assert problems == []
