"""The Kubernetes CEL authorizer library (``k8s.io/apiserver/pkg/cel/library/authz.go``, with
the ``AuthzSelectors`` extension of 1.31+).

Owns the values of the ``authorizer`` variable and its checks, and the functions ``path``,
``group``, ``serviceAccount``, ``resource``, ``subresource``, ``namespace``, ``name``,
``fieldSelector``, ``labelSelector``, ``check``, ``allowed``, ``reason``, ``errored``, ``error``,
with authz.go's semantics and error texts (``path must not be empty``, ``resource must not be
empty``, ``Invalid service account name``, ``Invalid service account namespace``).

Values are one-key maps as the other Kubernetes types here (see
:mod:`~policies.cel.library.quantity`): ``{"__authz__": "<json>"}`` (Authorizer),
``__authz_path__`` (PathCheck), ``__authz_group__`` (GroupCheck), ``__authz_resource__``
(ResourceCheck), ``__authz_decision__`` (Decision). The CEL runtime cannot carry a Python object
through an activation, so the authorizer value names a *session* (:class:`Session`, one per
request) registered here while the engine evaluates that request (:func:`bound`); ``check`` looks
it up and calls the session's injected :class:`~policies.authorization.Authorizer`, memoising
each decision for the request (as the API server's per-request caching authorizer does). The
registry holds a session only while its ``with`` block runs. ``authorizer.requestResource`` is a
field of the variable's map: the request's own resource as a ResourceCheck.

Must not import the CEL runtime (only ``policies/cel/runtime.py`` may) and must not do I/O (the
injected authorizer may; the webhook posts no review from its event loop: there it evaluates
with cached answers only, see ``webhook/admission.py``).
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from policies.authorization import Attributes, Authorizer, Decision, Subject, Verdict
from policies.cel.library.declarations import FunctionSpec, function
from policies.cel.library.format import dns1123_label, dns1123_subdomain
from policies.records import maker

AUTHORIZER_KEY: Final = "__authz__"
PATH_KEY: Final = "__authz_path__"
GROUP_KEY: Final = "__authz_group__"
RESOURCE_KEY: Final = "__authz_resource__"
DECISION_KEY: Final = "__authz_decision__"
# apimachinery's IsDNS1123Subdomain / IsDNS1123Label (ValidateServiceAccountName /
# ValidateNamespaceName).
_UNBOUND: Final = ("the authorizer of this value is not available: it belongs to a request "
                   "whose evaluation has ended")


@dataclass
class Session:
    """One request's authorizer: who is checked, the injected authorizer, the decisions made.

    ``errored`` counts the errored decisions handed to CEL (memoised ones too), so the engine
    can tell whether a rule's evaluation saw one (it then follows the policy's failurePolicy).
    Not thread-safe beyond what one request needs (its evaluation runs on one thread at a
    time).
    """

    authorizer: Authorizer
    subject: Subject
    decisions: dict[tuple[object, ...], Decision] = field(default_factory=dict)
    errored: int = 0
    last_error: str = ""

    def check(self, attributes: Attributes) -> Decision:
        """The decision for ``attributes``, asked once per request."""
        _COUNT.checks += 1
        key = attributes.key()
        decision = self.decisions.get(key)
        if decision is None:
            try:
                decision = self.authorizer.authorize(attributes)
            except Exception as exc:  # the protocol says it must not raise: never fail open
                decision = Decision(Verdict.NO_OPINION, "",
                                    f"authorizer failed: {type(exc).__name__}: {exc}")
            self.decisions[key] = decision
        if decision.errored:
            self.errored += 1
            self.last_error = decision.error
        return decision


_make_attributes = maker(Attributes)  # one per check of a request (see policies.records)


class _Count(threading.local):
    checks = 0


_COUNT = _Count()


def checks_made() -> int:
    """How many ``check()`` calls this thread has made (memoised decisions included): what
    the CEL cost of an evaluation counts them by (Kubernetes charges 350,000 each)."""
    return _COUNT.checks


_SESSIONS: dict[str, Session] = {}
_LOCK = threading.Lock()


@contextmanager
def bound(session: Session, request_resource: Mapping[str, str] | None = None
          ) -> Iterator[dict[str, Any]]:
    """Register ``session`` for the block; yields the ``authorizer`` variable's value.

    ``request_resource``: ``{group, resource, subresource, namespace, name}`` of the request
    (``authorizer.requestResource``); None: no such field.
    """
    handle = secrets.token_hex(8)
    with _LOCK:
        _SESSIONS[handle] = session
    value: dict[str, Any] = {AUTHORIZER_KEY: _dump({"s": handle, "sa": None})}
    if request_resource is not None:
        value["requestResource"] = {RESOURCE_KEY: _dump({
            "s": handle, "sa": None, "group": request_resource.get("group", ""),
            "resource": request_resource.get("resource", ""),
            "subresource": request_resource.get("subresource", ""),
            "namespace": request_resource.get("namespace", ""),
            "name": request_resource.get("name", ""),
            "fieldSelector": "", "labelSelector": ""})}
    try:
        yield value
    finally:
        with _LOCK:
            _SESSIONS.pop(handle, None)


# The state travels as compact JSON with sorted keys (one text per state, so equal checks are
# equal values). orjson writes and reads it: the standard library's sorted dump and its load cost
# 40 k and 24 k instructions, orjson's 4 k and 7 k, and a check chain
# (group.resource.namespace.name.check.allowed) runs six of each.
def _dump(state: Mapping[str, Any]) -> str:
    try:
        return orjson.dumps(state, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError:
        # Text orjson refuses (a lone surrogate from a request's name or namespace, which the
        # standard library decoded): escaped by the standard library, so the check still runs
        # and the CEL data check names the field. Deterministic: the same state, the same text.
        return json.dumps(state, sort_keys=True, separators=(",", ":"))


def _load(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # a lone surrogate escape, written by _dump's fallback
        return json.loads(text)


def _state(value: object, key: str, what: str) -> dict[str, Any]:
    # The runtime hands maps over as dicts: the exact type test first (the ABC check costs ~1 k).
    if not ((type(value) is dict or isinstance(value, Mapping))
            and isinstance(value.get(key), str)):
        raise TypeError(f"no such overload: expected {what}")
    state = _load(value[key])
    assert isinstance(state, dict)
    return state


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("no such overload: expected a string")
    return value


def authorizer_path(authorizer: object, path: object) -> dict[str, str]:
    """``<Authorizer>.path(string) -> PathCheck``; an empty (or blank) path is an error."""
    state = _state(authorizer, AUTHORIZER_KEY, "an Authorizer")
    if not _text(path).strip():
        raise ValueError("path must not be empty")
    return {PATH_KEY: _dump({**state, "path": path})}


def authorizer_group(authorizer: object, group: object) -> dict[str, str]:
    """``<Authorizer>.group(string) -> GroupCheck`` (``''`` is the core group)."""
    state = _state(authorizer, AUTHORIZER_KEY, "an Authorizer")
    return {GROUP_KEY: _dump({**state, "group": _text(group)})}


def authorizer_service_account(authorizer: object, namespace: object,
                               name: object) -> dict[str, str]:
    """``<Authorizer>.serviceAccount(namespace, name) -> Authorizer`` checking as that service
    account; the name must be a DNS subdomain and the namespace a DNS label (RFC 1123)."""
    state = _state(authorizer, AUTHORIZER_KEY, "an Authorizer")
    ns, sa = _text(namespace), _text(name)
    if dns1123_subdomain(sa):  # apimachinery's IsDNS1123Subdomain found a fault
        raise ValueError("Invalid service account name")
    if dns1123_label(ns):
        raise ValueError("Invalid service account namespace")
    return {AUTHORIZER_KEY: _dump({"s": state["s"], "sa": [ns, sa]})}


def group_resource(group_check: object, resource: object) -> dict[str, str]:
    """``<GroupCheck>.resource(string) -> ResourceCheck``; empty (or blank) is an error."""
    state = _state(group_check, GROUP_KEY, "a GroupCheck")
    if not _text(resource).strip():
        raise ValueError("resource must not be empty")
    return {RESOURCE_KEY: _dump({**state, "resource": resource, "subresource": "",
                                 "namespace": "", "name": "", "fieldSelector": "",
                                 "labelSelector": ""})}


def _resource_setter(attribute: str) -> Any:
    def setter(resource_check: object, value: object) -> dict[str, str]:
        state = _state(resource_check, RESOURCE_KEY, "a ResourceCheck")
        return {RESOURCE_KEY: _dump({**state, attribute: _text(value)})}
    setter.__doc__ = f"``<ResourceCheck>.{attribute}(string) -> ResourceCheck``."
    return setter


def _session(state: Mapping[str, Any]) -> tuple[Session | None, Subject | None]:
    with _LOCK:
        session = _SESSIONS.get(state["s"])
    if session is None:
        return None, None
    sa = state.get("sa")
    return session, Subject.service_account(sa[0], sa[1]) if sa else session.subject


def check(target: object, verb: object) -> dict[str, str]:
    """``<PathCheck>.check(verb)`` / ``<ResourceCheck>.check(verb) -> Decision``: the injected
    authorizer's answer for the request's user (or the ``serviceAccount``). A failing
    authorizer gives an errored decision, never a CEL error (as authz.go)."""
    verb_text = _text(verb)
    if (type(target) is dict or isinstance(target, Mapping)) and PATH_KEY in target:
        state = _state(target, PATH_KEY, "a PathCheck")
        session, subject = _session(state)
        attributes = None if subject is None else Attributes(
            subject, verb_text, resource_request=False, path=state["path"])
    else:
        state = _state(target, RESOURCE_KEY, "a PathCheck or ResourceCheck")
        session, subject = _session(state)
        attributes = None if subject is None else _make_attributes(
            subject=subject, verb=verb_text, resource_request=True, api_group=state["group"],
            resource=state["resource"], subresource=state["subresource"],
            namespace=state["namespace"], name=state["name"],
            field_selector=state["fieldSelector"], label_selector=state["labelSelector"])
    if session is None or attributes is None:
        decision = Decision(Verdict.NO_OPINION, "", _UNBOUND)
    else:
        decision = session.check(attributes)
    return {DECISION_KEY: _dump({"v": decision.verdict.value, "r": decision.reason,
                                 "e": decision.error})}


def decision_allowed(decision: object) -> bool:
    """``<Decision>.allowed()``: the decision is allow (no-opinion is not)."""
    return bool(_state(decision, DECISION_KEY, "a Decision")["v"] == Verdict.ALLOW.value)


def decision_reason(decision: object) -> str:
    """``<Decision>.reason()``."""
    return str(_state(decision, DECISION_KEY, "a Decision")["r"])


def decision_errored(decision: object) -> bool:
    """``<Decision>.errored()``: the check failed (its error is ``error()``)."""
    return bool(_state(decision, DECISION_KEY, "a Decision")["e"])


def decision_error(decision: object) -> str:
    """``<Decision>.error()``: the check's error, ``''`` when none."""
    return str(_state(decision, DECISION_KEY, "a Decision")["e"])


DECLARATIONS: Final[tuple[FunctionSpec, ...]] = (
    function("path", ("authorizer_path", ["opaque", "string"], "opaque", True, authorizer_path)),
    function("group",
             ("authorizer_group", ["opaque", "string"], "opaque", True, authorizer_group)),
    function("serviceAccount", ("authorizer_serviceaccount", ["opaque", "string", "string"],
                                "opaque", True, authorizer_service_account)),
    function("resource",
             ("groupcheck_resource", ["opaque", "string"], "opaque", True, group_resource)),
    *(function(name, (f"resourcecheck_{name.lower()}", ["opaque", "string"], "opaque", True,
                      _resource_setter(name)))
      for name in ("subresource", "namespace", "name", "fieldSelector", "labelSelector")),
    # authz.go has pathcheck_check and resourcecheck_check; one overload here (the runtime
    # dispatches by argument kind, and both receivers are maps).
    function("check", ("authz_check", ["opaque", "string"], "opaque", True, check)),
    function("allowed", ("decision_allowed", ["opaque"], "bool", True, decision_allowed)),
    function("reason", ("decision_reason", ["opaque"], "string", True, decision_reason)),
    function("errored", ("decision_errored", ["opaque"], "bool", True, decision_errored)),
    function("error", ("decision_error", ["opaque"], "string", True, decision_error)),
)
"""The authorizer library's functions, as :mod:`~policies.cel.library.libraries` collects
them."""
