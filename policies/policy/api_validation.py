"""The API server's creation checks of native admission objects that a JSON schema cannot say.

Owns the rules kube-apiserver's validation of ``admissionregistration.k8s.io`` objects applies on
top of their OpenAPI shape (k8s.io/kubernetes ``pkg/apis/admissionregistration/validation``),
in the API server's own words, so that a file gpuguard loads is one the cluster would store:

- ``metadata.name`` of a ValidatingAdmissionPolicy, MutatingAdmissionPolicy or their bindings is
  a DNS-1123 subdomain;
- a binding's ``paramRef`` names exactly one of ``name`` and ``selector`` and says its
  ``parameterNotFoundAction`` (there is no default);
- a ValidatingAdmissionPolicyBinding's ``validationActions`` do not hold both ``Deny`` and
  ``Warn``.

The texts were read from kube-apiserver 1.37.2 refusing such objects (``kubectl apply``). The
shape checks (types, enums, required fields, unique items) stay in
``policies/data/native-admission.schema.json``: nothing here repeats them.

Must not read files or compile CEL: it takes one parsed object and returns problems.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""k8s.io/apimachinery ``validation.IsDNS1123Subdomain``'s pattern (at most 253 characters)."""

_SUBDOMAIN_TEXT = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    f"used for validation is '{DNS1123_SUBDOMAIN.pattern}')")
_EXCLUSIVE = "Forbidden: name and selector are mutually exclusive"


def api_problems(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The API server's refusals of one native policy or binding object, as ``(field path,
    message)`` pairs in the API server's words (``Invalid value: ...``, ``Required value``,
    ``Forbidden: ...``); empty when it would be stored. Fields of the wrong type are left to
    the schema check."""
    problems: list[tuple[str, str]] = []
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if isinstance(name, str) and name:
        if len(name) > 253:
            problems.append(("metadata.name", f"Invalid value: {_quoted(name)}: must be no "
                                              "more than 253 characters"))
        if not DNS1123_SUBDOMAIN.fullmatch(name):
            problems.append(("metadata.name", f"Invalid value: {_quoted(name)}: "
                                              f"{_SUBDOMAIN_TEXT}"))
    spec = body.get("spec")
    if not isinstance(spec, Mapping) or not str(body.get("kind", "")).endswith("Binding"):
        return problems
    param_ref = spec.get("paramRef")
    if isinstance(param_ref, Mapping):
        has_name = bool(param_ref.get("name"))
        has_selector = param_ref.get("selector") is not None
        if has_name and has_selector:
            problems += [("spec.paramRef.name", _EXCLUSIVE),
                         ("spec.paramRef.selector", _EXCLUSIVE)]
        elif not has_name and not has_selector:
            problems.append(("spec.paramRef",
                             "Required value: one of name or selector must be specified"))
        if param_ref.get("parameterNotFoundAction") is None:
            problems.append(("spec.paramRef.parameterNotFoundAction", "Required value"))
    actions = spec.get("validationActions")
    if isinstance(actions, list) and "Deny" in actions and "Warn" in actions:
        listed = ",".join(_quoted(a) for a in actions)
        problems.append(("spec.validationActions",
                         f"Invalid value: [{listed}]: must not contain both Deny and Warn "
                         "(repeating the same validation failure information in the API "
                         "response and headers serves no purpose)"))
    return problems


def _quoted(value: Any) -> str:
    """A value as the API server's field errors quote it (Go's %q of a string)."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
