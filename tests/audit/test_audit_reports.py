"""Report outputs: HTML (offline, with SVG charts), Markdown, terminal, PolicyReports, --out, exit
codes and one-line errors."""

from __future__ import annotations

import contextlib
import io
import json
import re
from html.parser import HTMLParser

import jsonschema
import pytest
import yaml

from audit.render import html as render_html
from audit.render import markdown as render_markdown
from audit.report import policy_reports
from gpuguard.cli import main
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
METRICS = EXAMPLE / "metrics" / "dcgm-exporter.prom"
POLICIES = ROOT / "tests" / "data" / "audit" / "policies.yaml"
SCHEMA = json.loads((ROOT / "tests" / "data" / "audit" / "policyreport-v1alpha2.schema.json")
                    .read_text())


def audit(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["audit", *args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def report() -> dict:
    code, out, _ = audit("-f", str(EXAMPLE), "--metrics", str(METRICS), "--policies",
                         str(POLICIES), "-o", "json", "--jobs", "0")
    assert code == 0
    return json.loads(out)


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += attrs
        if tag not in ("meta", "br"):
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += attrs

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open[-5:])
        self.open.pop()


def test_html_is_self_contained_with_charts(report):
    page = render_html.render(report)
    parser = _Collector()
    parser.feed(page)
    parser.close()
    assert parser.open == []  # every element closed in order
    assert parser.tags.count("svg") == 5
    labels = [v for k, v in parser.attributes if k == "aria-label"]
    assert labels == ["GPU allocation per node", "GPU allocation per team",
                      "Fragmentation: nodes that can host an N-GPU pod", "Findings by policy",
                      "Mutations admission would apply (info)"]
    # nothing is fetched: no script, stylesheet link, image, frame or URL anywhere
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(parser.tags)
    assert not any(k in ("src", "href") for k, _ in parser.attributes)
    assert not re.search(r"https?://|url\(|@import", page)
    assert "9 nvidia.com/gpu free, but no node can host a 4-GPU pod" in page


def test_html_escapes_input():
    hostile = {"generated": "now", "source": {"paths": ["<script>alert(1)</script>"]},
               "settings": {"team_label": "t"},
               "summary": {"nodes": 0, "gpu_nodes": 0, "physical_gpus": {"known": 0,
                                                                         "nodes_unknown": 0},
                           "gpu_equivalents": {"allocatable": 0, "allocated": 0, "free": 0,
                                               "stranded": 0, "pending": 0,
                                               "idle_allocated": None,
                                               "allocated_share": None},
                           "whole_gpus": {"allocatable": 0, "allocated": 0, "free": 0,
                                          "stranded": 0},
                           "gpu_pods": {"running": 0, "pending": 0}, "pods": 0,
                           "finished_pods": 0, "workloads": 0, "gpu_workloads": 0,
                           "evaluated_workloads": 0,
                           "findings": {"deny": 1, "warn": 0, "audit": 0, "error": 0,
                                        "info": 0},
                           "stranded_by_cause": {cause: {"nodes": 0, "gpu_equivalents": 0,
                                                         "whole_gpus": 0}
                                                 for cause in ("node_unavailable",
                                                               "in_service")},
                           "exceptions": 0, "stranded_nodes": 0, "errors": 0, "warnings": 0},
               "nodes": [], "teams": [], "stranded": [], "pending": [],
               "fragmentation": {"whole_gpus": [], "gpu_equivalents": {
                   "free": 0, "largest_free_on_one_node": 0, "index": 0}},
               "mig": {"profiles": [], "unmet_profiles": []}, "utilization": None,
               "policies": [{"policy": "<b>p</b>", "deny": 1, "warn": 0, "audit": 0,
                             "error": 0, "info": 0, "pass": 0, "exempt": 0}],
               "findings": [{"severity": "deny", "policy": "<b>p</b>",
                             "workload": {"kind": "Pod", "namespace": "n", "name": "<i>x"},
                             "team": None, "message": "a </td><script>"}],
               "exceptions": [], "errors": [], "warnings": [], "changes": None}
    page = render_html.render(hostile)
    assert "<script>" not in page and "<i>x" not in page and "&lt;script&gt;" in page
    markdown = render_markdown.render(hostile)
    assert "<script>" not in markdown and "\\|" not in "".join(
        line for line in markdown.splitlines() if line.startswith("| deny"))


def test_policy_reports_validate(report):
    objects = policy_reports.build(report)
    for obj in objects:
        jsonschema.validate(obj, SCHEMA)
    kinds = [o["kind"] for o in objects]
    assert kinds.count("ClusterPolicyReport") == 1
    namespaces = [o["metadata"]["namespace"] for o in objects if o["kind"] == "PolicyReport"]
    # one per namespace with evaluated workloads, never one per resource
    assert namespaces == sorted(set(namespaces)) == ["gpu-operator", "sandbox", "team-llm",
                                                     "team-research", "team-vision"]
    research = next(o for o in objects if o["metadata"].get("namespace") == "team-research")
    # team-research, 8 GPU workloads: max-gpus-per-pod exempts all 8 (skip); shared-gpu-notice
    # warns on 4 (KAI pod, raycluster, hami pod, notebooks), 4 pass; queue-label-audit fails 3
    # (Audit -> fail, severity low), 5 pass -> 9 passed rules. The summary counts the results
    # (no pass results: the audit counts passes, it does not know which); the 9 are an annotation.
    assert research["summary"] == {"pass": 0, "fail": 3, "warn": 4, "error": 0, "skip": 8}
    assert research["metadata"]["annotations"] == {"gpuguard.io/passed-rules": "9"}
    results = research["results"]
    assert sum(r["result"] == "skip" for r in results) == 8
    assert {(r["result"], r["severity"]) for r in results} == {
        ("fail", "low"), ("warn", "medium"), ("skip", "info")}
    cluster = objects[-1]
    stranded = [r for r in cluster["results"] if r["rule"] == "stranded-gpus"]
    assert len(stranded) == 5
    assert {r["resources"][0]["name"] for r in stranded} >= {"gpu-node-a100-05"}


def test_every_report_summary_counts_its_own_results(report):
    for obj in policy_reports.build(report):
        outcomes = [r["result"] for r in obj["results"]]
        assert obj["summary"] == {k: outcomes.count(k)
                                  for k in ("pass", "fail", "warn", "error", "skip")}, (
            obj["kind"], obj["metadata"].get("namespace"))
    cluster = policy_reports.build(report)[-1]
    healthy = sum(1 for n in report["nodes"] if not n.get("stranded") and not n["warnings"])
    assert cluster["metadata"]["annotations"] == {
        "gpuguard.io/nodes-without-problems": str(healthy)}


@pytest.mark.parametrize("where", ["stdout", "out"])
def test_policy_report_yaml_has_no_anchors(where, tmp_path):
    # Every result shares one timestamp dict: PyYAML's safe_dump wrote it as &id001 / *id001.
    if where == "stdout":
        code, text, _ = audit("-f", str(EXAMPLE), "--policies", str(POLICIES), "-o",
                              "policyreport", "--jobs", "0")
    else:
        code, _, _ = audit("-f", str(EXAMPLE), "--policies", str(POLICIES), "--out",
                           str(tmp_path), "--jobs", "0")
        text = (tmp_path / "policyreports.yaml").read_text()
    assert code == 0
    assert not re.search(r"[&*]id\d+", text)
    reports = list(yaml.safe_load_all(text))
    stamps = [r["timestamp"] for o in reports for r in o["results"]]
    assert len(stamps) > 10 and all(stamp == stamps[0] for stamp in stamps)


def test_policy_reports_stay_under_the_size_limit(report):
    big = dict(report)
    finding = next(f for f in report["findings"] if f["severity"] == "audit")
    big["findings"] = [dict(finding, message="x" * 5000) for _ in range(400)]
    obj = next(o for o in policy_reports.namespace_reports(big)
               if o["metadata"]["namespace"] == finding["workload"]["namespace"])
    assert len(json.dumps(obj)) < policy_reports.MAX_REPORT_BYTES
    assert "left out" in obj["metadata"]["annotations"]["gpuguard.io/truncated-results"]
    jsonschema.validate(obj, SCHEMA)


def test_out_dir_writes_every_format(tmp_path):
    code, out, _ = audit("-f", str(EXAMPLE), "--metrics", str(METRICS), "--policies",
                           str(POLICIES), "--out", str(tmp_path / "out"), "--jobs", "0")
    assert code == 0
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["policyreports.yaml", "report.html", "report.json", "report.md"]
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["summary"]["gpu_pods"] == {"running": 33, "pending": 6}
    reports = list(yaml.safe_load_all((tmp_path / "out" / "policyreports.yaml").read_text()))
    assert len(reports) == 6
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "## Fragmentation of free GPUs (usable nodes)" in markdown
    # the terminal table went to stdout
    assert "Summary" in out and "GPU nodes" in out


@pytest.mark.parametrize("fmt", ["markdown", "html", "policyreport", "table"])
def test_every_output_format_renders(fmt):
    code, out, _ = audit("-f", str(EXAMPLE), "--policies", str(POLICIES), "-o", fmt,
                         "--jobs", "0")
    assert code == 0 and out.strip()


def test_fail_on_levels():
    args = ("-f", str(EXAMPLE), "--policies", str(POLICIES), "-o", "json", "--jobs", "0")
    assert audit(*args, "--fail-on", "deny")[0] == 1  # the LWS deny
    warn_only = ROOT / "tests" / "data" / "audit" / "warn-only.yaml"
    assert audit("-f", str(EXAMPLE), "--policies", str(warn_only), "-o", "json", "--jobs", "0",
                 "--fail-on", "deny")[0] == 0
    assert audit("-f", str(EXAMPLE), "--policies", str(warn_only), "-o", "json", "--jobs", "0",
                 "--fail-on", "warn")[0] == 1


def test_bad_input_is_one_line_per_problem_and_the_audit_goes_on(tmp_path):
    (tmp_path / "good.yaml").write_text((EXAMPLE / "namespaces.yaml").read_text())
    (tmp_path / "bad.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: [x\n")
    (tmp_path / "nokind.json").write_text('{"apiVersion": "v1"}')
    # (A missing --metrics file is no longer one of them: it refuses the audit, issue 13 —
    # tests/cli/test_cli_refusals.py.)
    code, out, err = audit("-f", str(tmp_path), "--policies", str(POLICIES), "-o", "json",
                           "--jobs", "0")
    assert code == 2  # the report is printed, but incomplete input passes no gate
    report = json.loads(out)
    lines = err.strip().splitlines()
    assert any(line.startswith(f"gpuguard: {tmp_path}/bad.yaml: document 0: invalid YAML")
               for line in lines)
    assert any(line.startswith(f"gpuguard: {tmp_path}/nokind.json: document 0: object has no "
                               "kind") for line in lines)
    assert "Traceback" not in err
    assert report["summary"]["errors"] == 2
    assert lines[-1] == "gpuguard: 2 input error(s), 0 warning(s) (listed in the report)"


def test_nothing_readable_is_exit_2(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    assert audit("-f", str(tmp_path / "bad.json"), "--policies", str(POLICIES))[0] == 2
    assert audit("-f", str(tmp_path / "missing"), "--policies", str(POLICIES))[0] == 2
    code, _, err = audit("--policies", str(POLICIES))
    assert code == 2 and "nothing to audit" in err
    code, _, err = audit("-f", str(EXAMPLE), "--cluster")
    assert code == 2 and "not both" in err
    code, _, err = audit("-f", str(EXAMPLE), "--idle-below", "200")
    assert code == 2 and err.strip() == ("gpuguard: error: --idle-below '200': expected a "
                                         "percentage from 0 to 100, e.g. 5")


def test_readme_audit_example_is_true():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"\$ gpuguard audit -f examples/cluster --metrics (\S+) -o json \\\n.*?\n"
                      r"(\{.*?\})\n(\".*?\")\n```", readme, re.S)
    assert block, "README shows the audit example"
    code, out, _ = audit("-f", str(EXAMPLE), "--metrics", str(ROOT / block[1]), "-o", "json",
                         "--jobs", "0")
    assert code == 0
    report = json.loads(out)
    assert json.dumps(report["summary"]["gpu_equivalents"], separators=(",", ":")) == block[2]
    assert json.dumps(report["fragmentation"]["whole_gpus"][0]["message"]) == block[3]
    assert "gpuguard audit -f examples/cluster" in readme.split("## Set-up")[1].split("```sh")[1]
