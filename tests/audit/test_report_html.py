"""The HTML audit report as a lead sees it: the bundled example rendered in headless Chromium
(Debian's ``chromium``, installed by .ci/run) at 700 px, measured from inside the page.

A copy of the page gets a probe script (the report itself has none) that measures the layout and
writes it into the DOM; ``chromium --dump-dom`` returns it. Checked: no horizontal overflow, every
chart drawn with no text cut at its edge, no empty section, findings by severity with the ``info``
mutations apart, stranded GPUs split into cordoned/NotReady and really stranded, human dates and
rounding, counts that match their tables, a print stylesheet. The screenshot is kept as
build/report-700px.png (git-ignored; the path is printed). Without chromium the Chromium tests
skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from audit.render import html as render_html
from audit.report.tables import moment, number, tables
from gpuguard.cli import main
from tests.paths import ROOT

EXAMPLE = ROOT / "examples" / "cluster"
METRICS = EXAMPLE / "metrics" / "dcgm-exporter.prom"
SCREENSHOT = ROOT / "build" / "report-700px.png"
WIDTH = 700

_PROBE = """<pre id="probe"></pre><script>
try {
const doc = document.documentElement;
const inScroll = e => e.closest('.scroll') && !e.classList.contains('scroll');
const out = {
  scrollWidth: doc.scrollWidth, clientWidth: doc.clientWidth, height: doc.scrollHeight,
  innerWidth: window.innerWidth,
  overflowing: [...document.body.querySelectorAll('*')]
    .filter(e => !inScroll(e) && e.id !== 'probe'
                 && e.getBoundingClientRect().right > doc.clientWidth + 0.5)
    .map(e => e.tagName + '#' + e.id + '.' + e.getAttribute('class')).slice(0, 10),
  charts: [...document.querySelectorAll('svg.chart')].map(svg => {
    const box = svg.viewBox.baseVal;
    const cut = [...svg.querySelectorAll('text')].filter(t => {
      const b = t.getBBox(); return b.x < -0.5 || b.x + b.width > box.width + 0.5;
    }).map(t => t.textContent);
    const bars = [...svg.querySelectorAll('rect')].filter(r => r.width.baseVal.value > 0);
    return {label: svg.getAttribute('aria-label'), cut: cut,
            classes: [...new Set(bars.map(r => r.getAttribute('class')))],
            bars: bars.length, lines: svg.querySelectorAll('polyline').length,
            shown: svg.getBoundingClientRect().width};
  }),
  sections: [...document.querySelectorAll('section')].map(s => ({
    id: s.id, title: s.querySelector('h2').textContent,
    rows: [...s.querySelectorAll('tr')].map(r => [...r.cells].map(c => c.textContent)),
    text: s.innerText.replace(s.querySelector('h2').innerText, '').trim()})),
  cards: [...document.querySelectorAll('.card')].map(c => ({
    value: c.querySelector('b').textContent, label: c.querySelector('span').textContent,
    bad: c.classList.contains('bad')})),
  generated: document.querySelector('.meta time')?.textContent ?? null,
  print: [...document.styleSheets].flatMap(s => [...s.cssRules])
    .filter(r => r.media && [...r.media].includes('print')).map(r => r.cssRules.length),
  text: document.body.innerText,
};
document.getElementById('probe').textContent = JSON.stringify(out);
} catch (error) {
  document.getElementById('probe').textContent = JSON.stringify({probe_error: String(error)});
}
</script>"""


def _chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed: .ci/run installs Debian's chromium (apt-get "
                    "install -y chromium); under CI=true the HTML report test must run")
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium); .ci/run "
                "installs it and CI runs this test")


def _browse(chromium: str, tmp: Path, page: Path, *flags: str) -> subprocess.CompletedProcess:
    """One headless Chromium run on ``page`` (root needs --no-sandbox; a profile of its own)."""
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}",
         *flags, page.as_uri()],
        capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def report() -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["audit", "-f", str(EXAMPLE), "--metrics", str(METRICS), "-o", "json",
                     "--jobs", "0"])
    assert code == 0
    return json.loads(out.getvalue())


def _measure(chromium: str, tmp: Path, html: str) -> dict:
    """The probe's measurements of one page at 700 px."""
    assert "<script" not in html
    probed = tmp / "probe.html"
    probed.write_text(html.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    dumped = _browse(chromium, tmp, probed, f"--window-size={WIDTH},900", "--dump-dom")
    match = re.search(r'<pre id="probe">(.*?)</pre>', dumped.stdout, re.S)
    assert match and match[1], f"chromium rendered no probe: {dumped.stderr[-2000:]}"
    measured: dict = json.loads(match[1].replace("&lt;", "<").replace("&gt;", ">")
                                .replace("&quot;", '"').replace("&amp;", "&"))
    assert "probe_error" not in measured, measured
    return measured


@pytest.fixture(scope="module")
def page(report, tmp_path_factory) -> dict:
    """The probe's measurements of the report at 700 px; the screenshot taken on the way."""
    chromium = _chromium()
    tmp = tmp_path_factory.mktemp("chromium")
    html = render_html.render(report)
    measured = _measure(chromium, tmp, html)
    plain = tmp / "report.html"
    plain.write_text(html, encoding="utf-8")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    shot = _browse(chromium, tmp, plain, "--hide-scrollbars",
                   f"--window-size={WIDTH},{measured['height']}", f"--screenshot={SCREENSHOT}")
    assert shot.returncode == 0 and SCREENSHOT.stat().st_size > 0, shot.stderr[-2000:]
    print(f"\nscreenshot of the HTML report at {WIDTH} px: {SCREENSHOT}")
    return measured


def _section(page: dict, key: str) -> dict:
    (found,) = [s for s in page["sections"] if s["id"] == key]
    return found


def _card(page: dict, label: str) -> dict:
    (found,) = [c for c in page["cards"] if c["label"].startswith(label)]
    return found


def test_nothing_overflows_sideways_at_700_px(page):
    assert page["innerWidth"] == WIDTH  # the viewport; clientWidth is less its scroll bar
    assert page["scrollWidth"] <= page["clientWidth"], page["overflowing"]
    assert page["overflowing"] == []


def test_every_chart_is_drawn_and_no_text_is_cut(page):
    labels = [c["label"] for c in page["charts"]]
    assert labels == ["GPU allocation per node", "GPU allocation per team",
                      "Fragmentation: nodes that can host an N-GPU pod", "Findings by policy",
                      "Mutations admission would apply (info)"]
    for chart in page["charts"]:
        assert chart["bars"] > 0, chart["label"]
        assert chart["cut"] == [], f"{chart['label']}: text past the chart's edge"
        assert 0 < chart["shown"] <= WIDTH


def test_no_section_is_empty(page):
    for section in page["sections"]:
        assert section["text"], f"section {section['id']} ({section['title']}) shows nothing"
        if section["id"] != "empty":
            assert len(section["rows"]) >= 2 or section["id"] == "summary", section["id"]
    # Sections with no rows are named once instead of standing empty.
    assert "Policy exceptions applied" in _section(page, "empty")["text"]


def test_findings_are_by_severity_with_info_apart(page, report):
    charts = {c["label"]: c for c in page["charts"]}
    assert "s-info" not in charts["Findings by policy"]["classes"]
    assert set(charts["Findings by policy"]["classes"]) <= {"s-deny", "s-warn", "s-audit",
                                                            "s-error"}
    assert charts["Mutations admission would apply (info)"]["classes"][0] == "s-info"
    findings = report["summary"]["findings"]
    for level in ("deny", "warn", "audit", "error"):
        assert _card(page, f"{level} findings")["value"] == str(findings[level])
    assert _card(page, "mutations admission would apply")["value"] == str(findings["info"]) \
        == "37"
    rows = _section(page, "findings")["rows"][1:]
    assert len(rows) == findings["deny"] + findings["warn"] + findings["audit"] \
        + findings["error"]
    assert {r[0] for r in rows} == {"deny"}


def test_stranded_gpus_are_split_into_cordoned_or_notready_and_really_stranded(page, report):
    unavailable = {s["node"] for s in report["stranded"] if s["node_unavailable"]}
    in_service = {s["node"] for s in report["stranded"] if not s["node_unavailable"]}
    # examples/cluster/README.md: a100-02 is cordoned, a100-03 NotReady; a100-04 tainted,
    # a100-05 out of CPU, the -MIG-INVALID node misconfigured.
    assert unavailable == {"gpu-node-a100-02", "gpu-node-a100-03"}
    assert in_service == {"gpu-node-a100-04", "gpu-node-a100-05", "gpu-node-a100-mig-invalid-01"}
    assert {r[0] for r in _section(page, "stranded-unavailable")["rows"][1:]} == unavailable
    assert {r[0] for r in _section(page, "stranded")["rows"][1:]} == in_service
    really = _card(page, "stranded on in-service nodes")
    parked = _card(page, "free on cordoned/NotReady nodes")
    assert (really["value"], really["bad"]) == ("10", True)
    assert (parked["value"], parked["bad"]) == ("16", False)
    causes = report["summary"]["stranded_by_cause"]
    assert causes["node_unavailable"]["gpu_equivalents"] + causes["in_service"][
        "gpu_equivalents"] == report["summary"]["gpu_equivalents"]["stranded"] == 26
    assert "s-unavailable" in page["charts"][0]["classes"]


def test_dates_and_figures_read_as_a_person_writes_them(page, report):
    assert re.fullmatch(r"\d{1,2} [A-Z][a-z]{2} \d{4}, \d{2}:\d{2} UTC", page["generated"])
    assert page["generated"] == moment(report["generated"])
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", page["text"]), "a raw ISO time"
    assert not re.search(r"(?<![\w.])\d+\.\d{3,}(?![\w.])", page["text"]), "3+ decimals"


def test_counts_match_the_tables_they_sit_above(page):
    summary = dict(_section(page, "summary")["rows"])
    counted = re.search(r"(\d+) input error\(s\), (\d+) warning\(s\)", summary["problems"])
    problems = _section(page, "problems")["rows"][1:] if any(
        s["id"] == "problems" for s in page["sections"]) else []
    assert int(counted[1]) == sum(1 for r in problems if r[0] == "error")
    assert int(counted[2]) == sum(1 for r in problems if r[0] != "error")


def test_the_summary_counts_the_node_warnings_the_problems_table_lists(report):
    # The example's report has two input warnings (gpu-operator#637's node advertises two
    # counters gpuguard does not know) and one node warning (MIG-INVALID): one list of three,
    # which summary.warnings, stderr and the problems table all count (the issue's "0
    # warning(s)" above a table listing one, then the trial's 2 against 3).
    assert report["summary"]["warnings"] == len(report["warnings"]) == 3
    sections = {t.key: t for t in tables(report)}
    assert [r[1] for r in sections["problems"].rows] == report["warnings"]
    assert dict(sections["summary"].rows)["problems"].endswith("0 input error(s), 3 warning(s)")


def test_the_page_has_a_print_stylesheet(page):
    assert page["print"] and all(count > 0 for count in page["print"])


@pytest.mark.parametrize(("value", "text"), [
    (72.142857, "72.1"), (4.142857, "4.14"), (0.142857, "0.14"), (8.0, "8"), (0.0, "0"),
    (0.004, "<0.01"), (-0.0, "0"), (None, "?"), (35.6, "35.6")])
def test_figures_are_rounded_for_reading(value, text):
    assert number(value) == text


@pytest.mark.parametrize(("value", "text"), [
    ("2026-12-02T01:20:15.031985+00:00", "2 Dec 2026, 01:20 UTC"),
    ("2026-03-09T23:59:59+02:00", "9 Mar 2026, 21:59 UTC"),
    ("2026-03-09T08:00:00Z", "9 Mar 2026, 08:00 UTC"),
    ("now", "now"), (None, "-")])
def test_times_are_shown_in_utc_to_the_minute(value, text):
    assert moment(value) == text


PRICES = ROOT / "tests" / "data" / "audit" / "prices.yaml"


@pytest.fixture(scope="module")
def priced(tmp_path_factory) -> tuple[dict, dict]:
    """The example priced with tests/data/audit/prices.yaml after three recorded runs (10:00,
    11:00, 13:00): ``(report, the probe's measurements of its page)``."""
    from audit.prices import read_price_table
    from audit.report import cost
    from audit.report.history import History

    chromium = _chromium()
    tmp = tmp_path_factory.mktemp("chromium-priced")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["audit", "-f", str(EXAMPLE), "--metrics", str(METRICS), "--prices",
                     str(PRICES), "-o", "json", "--jobs", "0"]) == 0
    report = json.loads(out.getvalue())
    history = History(str(tmp / "history.sqlite"))
    for at in ("2026-12-01T10:00:00+00:00", "2026-12-01T11:00:00+00:00",
               "2026-12-01T13:00:00+00:00"):
        report = {**report, "generated": at}
        report["changes"] = None
        history.record(report)
    report["history"] = history.series()
    report["cost"] = {**report["cost"], "window": cost.window(read_price_table(str(PRICES)),
                                                              history.waste_series())}
    history.close()
    return report, _measure(chromium, tmp, render_html.render(report))


def test_the_priced_page_shows_the_cost_tables_cards_and_the_money_chart(priced):
    report, page = priced
    assert page["scrollWidth"] <= page["clientWidth"], page["overflowing"]
    charts = {c["label"]: c for c in page["charts"]}
    money = charts["Cost of idle and stranded GPUs over time"]
    assert money["lines"] == 2 and money["cut"] == []  # idle and stranded, one line each
    assert all(c["cut"] == [] for c in page["charts"])
    idle = report["cost"]["rate"]["idle"]["cost_per_hour"]
    assert _card(page, "idle GPUs cost per hour")["value"] == f"USD {idle:,.2f}" == "USD 13.71"
    assert _card(page, "stranded GPUs cost per hour")["value"] == "USD 45.00"
    rate = _section(page, "cost")["rows"]
    assert rate[0] == ["state", "team", "namespace / GPU product", "GPU-eq", "per hour"]
    assert ["idle", "research", "team-research", "2", "USD 8.00"] in rate
    assert ["stranded", "-", "NVIDIA-A100-SXM4-80GB", "16", "USD 24.00"] in rate
    window = _section(page, "cost-window")
    # 3 h of 2 idle research GPU-equivalents at 4.00 per H100-hour; 26 stranded for 3 h
    assert ["idle", "research", "team-research", "6", "USD 24.00"] in window["rows"]
    assert ["stranded", "-", "NVIDIA-A100-SXM4-40GB", "30", "USD 63.00"] in window["rows"]
    assert "3 run(s) from 1 Dec 2026, 10:00 UTC to 1 Dec 2026, 13:00 UTC (3 h" in window["text"]
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", page["text"]), "a raw ISO time"
