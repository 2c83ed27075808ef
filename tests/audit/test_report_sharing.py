"""The report shares equal small dicts between its entries (memory: a 1M-pod report has ~240k
findings over ~100k workloads), and no writer shows it: YAML is written with no anchors or
aliases and reads back as the JSON."""

from __future__ import annotations

import contextlib
import io
import json

import yaml

from audit.report.assemble import assemble
from audit.scan.scanner import scan
from audit.settings import AuditSettings
from audit.sources.files import iter_snapshot
from gpuguard.cli import main
from gpuguard.policy_set import load
from policies.facts.resource_names import GPUSettings
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"


def _report(capsys, output: str) -> str:
    capsys.readouterr()
    assert main(["audit", "-f", str(EXAMPLE), "-o", output, "--jobs", "0"]) == 0
    return capsys.readouterr().out


def test_findings_of_one_workload_share_its_ref_and_workloads_their_counts():
    with contextlib.redirect_stderr(io.StringIO()):
        engine = load(None, GPUSettings()).engine
    report = assemble(scan(iter_snapshot([str(EXAMPLE)]), AuditSettings(), engine))
    by_workload: dict[tuple[str, str], list[dict]] = {}
    for finding in report["findings"]:
        by_workload.setdefault((finding["workload"]["namespace"], finding["workload"]["name"]),
                               []).append(finding["workload"])
    repeated = [refs for refs in by_workload.values() if len(refs) > 1]
    assert repeated and all(all(r is refs[0] for r in refs) for refs in repeated)
    severities = [w["findings"] for w in report["workloads"]]
    assert len({id(s) for s in severities}) == len({tuple(s.items()) for s in severities})


def test_yaml_has_no_aliases_and_reads_back_as_the_json(capsys):
    text = _report(capsys, "yaml")
    assert "&id" not in text and "*id" not in text
    as_json = json.loads(_report(capsys, "json"))
    as_yaml = yaml.safe_load(text)
    as_json.pop("generated")
    as_yaml.pop("generated")
    assert as_yaml == as_json
