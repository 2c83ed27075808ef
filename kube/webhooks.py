"""Set the caBundle of webhook configurations in the cluster.

Owns the Kubernetes API calls behind ``gpuguard certs inject --live``: read a
ValidatingWebhookConfiguration or MutatingWebhookConfiguration, then send one RFC 6902 JSON patch
that sets ``webhooks[*].clientConfig.caBundle`` and first tests ``metadata.resourceVersion``, so a
concurrent writer makes the patch fail instead of being overwritten (optimistic concurrency).
Nothing is sent when every caBundle already has the value.

Must not read certificates (it is given the caBundle value) or know about HTTP serving.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

_KINDS = {
    "validatingwebhookconfiguration": "ValidatingWebhookConfiguration",
    "mutatingwebhookconfiguration": "MutatingWebhookConfiguration",
}
_METHODS = {
    "ValidatingWebhookConfiguration": ("read_validating_webhook_configuration",
                                       "patch_validating_webhook_configuration"),
    "MutatingWebhookConfiguration": ("read_mutating_webhook_configuration",
                                     "patch_mutating_webhook_configuration"),
}


class WebhookConfigError(Exception):
    """A live caBundle update failed; ``str(error)`` is ``"<Kind>/<name>: <problem>"``."""


class ApiUnreachable(WebhookConfigError):
    """The API server cannot be reached (connection refused or reset, DNS, TLS, timeouts): the
    environment, not the configuration object."""


def _call(kind: str, name: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` with the client's errors as :class:`WebhookConfigError`."""
    try:
        return function(*args, **kwargs)
    except ApiException as exc:
        raise WebhookConfigError(f"{kind}/{name}: {_problem(exc)}") from None
    except OSError as exc:
        raise ApiUnreachable(f"{kind}/{name}: cannot reach the API server: "
                             f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # urllib3 raises its own hierarchy (MaxRetryError, ...)
        if type(exc).__module__.startswith("urllib3"):
            raise ApiUnreachable(f"{kind}/{name}: cannot reach the API server: "
                                 f"{type(exc).__name__}") from None
        raise


@dataclass(frozen=True)
class LiveInjection:
    """The outcome of :func:`set_ca_bundle` for one configuration.

    Attributes:
        kind: ``ValidatingWebhookConfiguration`` or ``MutatingWebhookConfiguration``.
        name: the object name.
        webhooks: the names of all its webhooks.
        changed: the webhooks whose caBundle was patched (empty: nothing was sent).
    """

    kind: str
    name: str
    webhooks: tuple[str, ...]
    changed: tuple[str, ...]


def parse_target(text: str) -> tuple[str, str]:
    """``validatingwebhookconfiguration/NAME`` (kubectl style; plural and any case accepted).

    Returns:
        ``(Kind, name)``.

    Raises:
        ValueError: not ``KIND/NAME`` with one of the two webhook configuration kinds.
    """
    kind, _, name = text.partition("/")
    resource = kind.lower().removesuffix(".admissionregistration.k8s.io").removesuffix("s")
    canonical = _KINDS.get(resource)
    if canonical is None or not name:
        raise ValueError(
            f"--live {text!r}: expected validatingwebhookconfiguration/NAME or "
            "mutatingwebhookconfiguration/NAME"
        )
    return canonical, name


def _problem(exc: ApiException) -> str:
    if exc.status == 404:
        return "not found in the cluster"
    if exc.status == 403:
        return "forbidden: the credentials may not get/patch webhook configurations"
    if exc.status in (409, 422):
        return "changed while being patched (resourceVersion moved); run again"
    return f"API error {exc.status} {exc.reason}".strip()


def set_ca_bundle(api: Any, kind: str, name: str, ca_bundle: str, *,
                  dry_run: bool = False) -> LiveInjection:
    """Set ``caBundle`` on every webhook of the configuration ``kind``/``name``.

    Args:
        api: a ``kubernetes.client.AdmissionregistrationV1Api`` (or an object with its
            ``read_*_webhook_configuration`` / ``patch_*_webhook_configuration`` methods and an
            ``api_client``); see :func:`admission_api`.
        kind: ``ValidatingWebhookConfiguration`` or ``MutatingWebhookConfiguration``.
        name: the object name.
        ca_bundle: the base64 caBundle value.
        dry_run: send the patch with ``dryRun=All`` (validated by the API server, not stored).

    Returns:
        A :class:`LiveInjection`.

    Raises:
        WebhookConfigError: not found, forbidden, changed concurrently, other API errors;
            :class:`ApiUnreachable` (a subclass) when the API server cannot be reached.
        ValueError: an unknown ``kind``.
    """
    if kind not in _METHODS:
        raise ValueError(f"kind {kind!r}: not a webhook configuration kind")
    read, patch = (getattr(api, method) for method in _METHODS[kind])
    current = api.api_client.sanitize_for_serialization(_call(kind, name, read, name))
    webhooks = current.get("webhooks") or []
    operations: list[dict[str, Any]] = []
    changed: list[str] = []
    for index, webhook in enumerate(webhooks):
        if (webhook.get("clientConfig") or {}).get("caBundle") == ca_bundle:
            continue
        changed.append(str(webhook.get("name", f"webhooks[{index}]")))
        operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle",
                           "value": ca_bundle})
    if operations:
        version = (current.get("metadata") or {}).get("resourceVersion")
        if version:
            operations.insert(0, {"op": "test", "path": "/metadata/resourceVersion",
                                  "value": version})
        options = {"dry_run": "All"} if dry_run else {}
        _call(kind, name, patch, name, operations, **options)
    return LiveInjection(kind, name, tuple(str(w.get("name", "")) for w in webhooks),
                         tuple(changed))


def admission_api(api_client: Any) -> Any:
    """An ``AdmissionregistrationV1Api`` on ``api_client`` (from :func:`kube.config.detect`)."""
    return k8s_client.AdmissionregistrationV1Api(api_client)
