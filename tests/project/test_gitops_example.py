"""examples/gitops: a folder of gpuguard.io objects applied by kustomize (issue 17 item 4).

What a policy repository's CI would check: every object file is in the kustomization (one left
out would silently not be applied), the folders lint clean, and the copies of library policies
are the library's (they would drift otherwise). tests/controlplane/test_cluster_policies_live.py
applies the kustomization to a real API server (server-side dry run).
"""

from __future__ import annotations

import yaml

from gpuguard import policy_set
from policies.facts.resource_names import GPUSettings
from tests.paths import ROOT

GITOPS = ROOT / "examples" / "gitops"
FOLDERS = ("policies", "quotas", "exceptions")


def test_the_kustomization_lists_every_object_file():
    kustomization = yaml.safe_load((GITOPS / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = set(kustomization["resources"])
    files = {str(p.relative_to(GITOPS)) for folder in FOLDERS
             for p in (GITOPS / folder).rglob("*.yaml")}
    assert listed == files


def test_the_folders_lint_clean_and_hold_each_kind():
    loaded = policy_set.load([str(GITOPS / folder) for folder in FOLDERS], GPUSettings())
    assert not loaded.errors and not loaded.warnings, (loaded.errors, loaded.warnings)
    policies = loaded.engine.policies
    assert set(policies.names()) == {"gpu-requests-equal-limits", "no-privileged-gpu",
                                     "team-a-max-gpus"}
    assert [q.name for q in policies.quotas] == ["team-a"]
    (limited,) = [p for p in policies.policies if p.name == "team-a-max-gpus"]
    assert [e.namespaces for e in limited.exceptions] == [("team-a",)]


def test_library_copies_are_the_library():
    copies = [p for p in (GITOPS / "policies").glob("*.yaml")
              if (ROOT / "policies" / "library" / p.name).exists()]
    assert sorted(p.name for p in copies) == ["gpu-requests-equal-limits.yaml",
                                              "no-privileged-gpu.yaml"]
    for path in copies:
        library = ROOT / "policies" / "library" / path.name
        assert path.read_bytes() == library.read_bytes(), f"{path} differs from {library}"
