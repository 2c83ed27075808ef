"""The refusals of tests/data/api-refusals are kube-apiserver's, in its words.

Each document is created with ``--dry-run=server``; the API server must refuse it, and every
``path: message`` that tests/core/test_api_validation.py expects of gpuguard must be in its answer
(the params case aside: there the API server's compile error carries the expression under a
caret, worded ``compilation failed: ERROR: <input>:1:1: undeclared reference to 'params' (in
container '')``, and gpuguard's says line and column in its own form).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.controlplane.cluster import ControlPlane
from tests.core.test_api_validation import REFUSALS, _refused_documents
from tests.core.test_json_patch import LITERAL_REFUSALS, literal_documents


@pytest.mark.parametrize("document", _refused_documents(), ids=lambda d: d["metadata"]["name"])
def test_the_api_server_refuses_each_with_the_same_words(control_plane: ControlPlane,
                                                         tmp_path: Path, document) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    answer = control_plane.kubectl("create", "--dry-run=server", "-f", str(path))
    assert answer.returncode != 0, answer.stdout
    for where, message in REFUSALS[document["metadata"]["name"]]:
        if "undeclared reference to 'params'" in message:
            assert f"{where}: Invalid value: " in answer.stderr
            assert "undeclared reference to 'params' (in container '')" in answer.stderr
            continue
        assert f"{where}: {message}" in answer.stderr, answer.stderr


@pytest.mark.parametrize("document", literal_documents(), ids=lambda d: d["metadata"]["name"])
def test_the_api_server_refuses_jsonpatch_literal_fields_where_gpuguard_does(
        control_plane: ControlPlane, tmp_path: Path, document) -> None:
    """Same line, column and words as tests/core/test_json_patch.py expects of gpuguard."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    answer = control_plane.kubectl("create", "--dry-run=server", "-f", str(path))
    assert answer.returncode != 0, answer.stdout
    found = [line.split("ERROR: <input>:", 1)[1] for line in answer.stderr.splitlines()
             if "ERROR: <input>:" in line]
    assert found == [f"{line}:{column}: {message}" for line, column, message
                     in LITERAL_REFUSALS[document["metadata"]["name"]]], answer.stderr
