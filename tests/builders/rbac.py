"""The RBAC objects of tests/data/rbac/gpu-roles.yaml as the offline authorizer (the library's
gpu-requesters asks it through CEL ``authorizer``)."""

from __future__ import annotations

import functools

from policies.rbac import RBACAuthorizer
from policies.sources import read_documents
from tests.paths import TESTS


@functools.cache
def gpu_roles() -> RBACAuthorizer:
    """Groups gpu-users (any GPU), gpu-interns (small MIG), gpu-a100, ml-researchers (H100 in
    ml), user gpu-admin; see the file's comments."""
    documents, errors = read_documents([str(TESTS / "data" / "rbac" / "gpu-roles.yaml")])
    assert not errors, errors
    return RBACAuthorizer(d.body for d in documents)
