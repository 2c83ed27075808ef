"""The API server's creation checks of native admission objects that a JSON schema cannot say.

Owns the rules kube-apiserver's validation of ``admissionregistration.k8s.io`` objects applies on
top of their OpenAPI shape (k8s.io/kubernetes ``pkg/apis/admissionregistration/validation``),
in the API server's own words, so that a file gpuguard loads is one the cluster would store:

- ``metadata.name`` of a ValidatingAdmissionPolicy, MutatingAdmissionPolicy or their bindings is
  a DNS-1123 subdomain;
- a binding's ``paramRef`` names exactly one of ``name`` and ``selector`` and says its
  ``parameterNotFoundAction`` (there is no default);
- a ValidatingAdmissionPolicyBinding's ``validationActions`` do not hold both ``Deny`` and
  ``Warn``;
- a policy's ``auditAnnotations`` keys make a qualified name after ``<policy name>/`` and are
  unique, its ``variables`` are CEL identifiers, its ``matchConditions`` names qualified names
  and unique, its ``paramKind`` names ``apiVersion`` and ``kind``;
- every label selector (``namespaceSelector``, ``objectSelector`` of ``matchConstraints`` and
  a binding's ``matchResources``) has qualified-name keys and label values, ``values`` for
  ``In`` / ``NotIn`` and none for ``Exists`` / ``DoesNotExist``.

The texts were read from kube-apiserver 1.37.2 refusing such objects (``kubectl apply``). The
shape checks (types, enums, required fields, unique items) stay in
``policies/data/native-admission.schema.json``: nothing here repeats them.

Must not read files or compile CEL: it takes one parsed object and returns problems.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.cel.library.format import dns1123_subdomain, label_value, qualified_name
from policies.cel.scanner import is_identifier

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
        problems += [("metadata.name", f"Invalid value: {_quoted(name)}: {fault}")
                     for fault in dns1123_subdomain(name)]
    spec = body.get("spec")
    if not isinstance(spec, Mapping):
        return problems
    kind = str(body.get("kind", ""))
    problems += _selector_problems(spec, "matchResources" if kind.endswith("Binding")
                                   else "matchConstraints")
    if not kind.endswith("Binding"):
        return problems + _policy_problems(spec, name if isinstance(name, str) else "")
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


def _items(spec: Mapping[str, Any], key: str) -> list[tuple[int, Mapping[str, Any]]]:
    items = spec.get(key)
    return [(i, item) for i, item in enumerate(items) if isinstance(item, Mapping)] \
        if isinstance(items, list) else []


def _qualified_and_unique(spec: Mapping[str, Any], key: str, field: str,
                          prefix: str = "") -> list[tuple[str, str]]:
    """``spec.<key>[i].<field>``: ``prefix`` + the value a qualified name, each value once."""
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for index, item in _items(spec, key):
        value = item.get(field)
        if not isinstance(value, str) or not value:
            continue
        where = f"spec.{key}[{index}].{field}"
        problems += [(where, f"Invalid value: {_quoted(prefix + value)}: {message}")
                     for message in qualified_name(prefix + value, "bytes")]
        if value in seen:
            problems.append((where, f"Duplicate value: {_quoted(value)}"))
        seen.add(value)
    return problems


def _policy_problems(spec: Mapping[str, Any], policy: str) -> list[tuple[str, str]]:
    """A ValidatingAdmissionPolicy's or MutatingAdmissionPolicy's own checks."""
    problems = _qualified_and_unique(spec, "auditAnnotations", "key", f"{policy}/")
    for index, variable in _items(spec, "variables"):
        name = variable.get("name")
        if isinstance(name, str) and name and not is_identifier(name):
            problems.append((f"spec.variables[{index}].name",
                             f"Invalid value: {_quoted(name)}: must be a valid CEL identifier"))
    problems += _qualified_and_unique(spec, "matchConditions", "name")
    param_kind = spec.get("paramKind")
    if isinstance(param_kind, Mapping):
        problems += [(f"spec.paramKind.{key}", "Required value")
                     for key in ("apiVersion", "kind") if not param_kind.get(key)]
    for index, mutation in _items(spec, "mutations"):
        # validateMutation: the other patch type's field must be absent (k8s.io/kubernetes
        # pkg/apis/admissionregistration/validation, the value written as it writes it)
        kind = mutation.get("patchType")
        other = {"JSONPatch": "applyConfiguration", "ApplyConfiguration": "jsonPatch"}.get(
            kind if isinstance(kind, str) else "")
        if other is not None and mutation.get(other) is not None:
            problems.append((f"spec.mutations[{index}].{other}",
                             f'Invalid value: "{{{other}}}": must not be specified when '
                             f"patchType is {kind}"))
    return problems


def _selector_problems(spec: Mapping[str, Any], match: str) -> list[tuple[str, str]]:
    """``ValidateLabelSelector`` of the namespace and object selectors under ``match``."""
    problems: list[tuple[str, str]] = []
    resources = spec.get(match)
    if not isinstance(resources, Mapping):
        return problems
    for selector_name in ("namespaceSelector", "objectSelector"):
        selector = resources.get(selector_name)
        if not isinstance(selector, Mapping):
            continue
        where = f"spec.{match}.{selector_name}"
        labels = selector.get("matchLabels")
        for key, value in (labels.items() if isinstance(labels, Mapping) else ()):
            problems += [(f"{where}.matchLabels", f"Invalid value: {_quoted(key)}: {message}")
                         for message in qualified_name(str(key), "bytes")]
            if isinstance(value, str):
                problems += [(f"{where}.matchLabels", f"Invalid value: {_quoted(value)}: "
                              f"{message}") for message in label_value(value, "bytes")]
        for index, expression in _items(selector, "matchExpressions"):
            at = f"{where}.matchExpressions[{index}]"
            operator, values = expression.get("operator"), expression.get("values")
            if operator in ("In", "NotIn") and not values:
                problems.append((f"{at}.values", "Required value: must be specified when "
                                                 "`operator` is 'In' or 'NotIn'"))
            elif operator in ("Exists", "DoesNotExist") and values:
                problems.append((f"{at}.values", "Forbidden: may not be specified when "
                                                 "`operator` is 'Exists' or 'DoesNotExist'"))
            key = expression.get("key")
            if isinstance(key, str):
                problems += [(f"{at}.key", f"Invalid value: {_quoted(key)}: {message}")
                             for message in qualified_name(key, "bytes")]
    return problems
