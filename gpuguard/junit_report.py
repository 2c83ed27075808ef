r"""``gpuguard test -o junit``: the suites' results as JUnit XML, the test-report format CI systems
(GitLab, Jenkins, GitHub's test reporters, Azure) show per case.

Owns the mapping: one ``<testsuite>`` per GPUPolicyTest suite (``file`` = its source), one
``<testcase>`` per case (``classname`` = the suite); a ``fail`` case gets ``<failure>``, an
``error`` case ``<error>``, a ``skip`` case ``<skipped>``, each with the case's differences; a
problem with a whole suite (unreadable, policies that do not load) is an ``<error>`` testcase named
``(suite)``. Characters XML 1.0 cannot hold are written as ``\uXXXX``. Must not run anything.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from policies.suites import ERRORED, FAILED, SKIPPED, SuiteResult

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ELEMENT = {FAILED: "failure", ERRORED: "error", SKIPPED: "skipped"}


def _text(value: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\u{ord(m[0]):04x}", value)


def _counts(element: ET.Element, cases: Sequence[ET.Element]) -> None:
    """``tests``, ``failures``, ``errors`` and ``skipped`` of ``element`` from its cases."""
    element.set("tests", str(len(cases)))
    for tag, attribute in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        element.set(attribute, str(sum(1 for c in cases if c.find(tag) is not None)))


def junit_xml(results: Sequence[SuiteResult]) -> str:
    """The JUnit XML document (UTF-8 text with its declaration) of ``results``."""
    root = ET.Element("testsuites", name="gpuguard test")
    every: list[ET.Element] = []
    for suite in results:
        element = ET.SubElement(root, "testsuite", name=_text(suite.name),
                                file=_text(suite.source))
        cases = []
        for problem in suite.errors:
            case = ET.SubElement(element, "testcase", classname=_text(suite.name),
                                 name="(suite)", file=_text(suite.source))
            ET.SubElement(case, "error", message=_text(problem)).text = _text(problem)
            cases.append(case)
        for result in suite.cases:
            case = ET.SubElement(element, "testcase", classname=_text(suite.name),
                                 name=_text(result.case), file=_text(result.source))
            tag = _ELEMENT.get(result.status)
            if tag is not None:
                detail = "\n".join(result.differences)
                first = result.differences[0] if result.differences else result.status
                child = ET.SubElement(case, tag, message=_text(first))
                if tag != "skipped":
                    child.text = _text(detail)
            cases.append(case)
        _counts(element, cases)
        every += cases
    _counts(root, every)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") \
        + "\n"
