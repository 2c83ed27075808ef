"""Finding the cluster: in-cluster service account or kubeconfig, or none (standalone).

Owns building an authenticated ``kubernetes`` API client from, in order: an explicit kubeconfig
path, the pod's service account (``KUBERNETES_SERVICE_HOST`` and the mounted token), then
``$KUBECONFIG`` / ``~/.kube/config``. When none applies, :func:`detect` returns None and callers
run standalone.

Must not know about HTTP serving or policy semantics; only :mod:`kube` imports ``kubernetes``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class ClusterConfigError(Exception):
    """A cluster configuration was found but cannot be used (the message says which and why)."""


@dataclass(frozen=True)
class ClusterConfig:
    """An API client and where its configuration came from (for the start-up log line).

    Attributes:
        api_client: a ``kubernetes.client.ApiClient``.
        source: ``in-cluster service account`` or ``kubeconfig PATH``.
    """

    api_client: k8s_client.ApiClient
    source: str


def _kubeconfig_candidates(environ: Mapping[str, str]) -> list[str]:
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [str(Path("~/.kube/config").expanduser())]


def detect(
    kubeconfig: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    token_file: str = SERVICE_ACCOUNT_TOKEN,
) -> ClusterConfig | None:
    """The cluster to talk to, or None when no cluster is configured (standalone).

    Args:
        kubeconfig: an explicit kubeconfig file (must exist).
        environ: the environment to read (default ``os.environ``).
        token_file: the service-account token path that marks running in a pod.

    Raises:
        ClusterConfigError: the explicit kubeconfig is missing, or a configuration that was
            found (in-cluster or kubeconfig) is invalid.
    """
    environ = os.environ if environ is None else environ
    configuration = k8s_client.Configuration()
    try:
        if kubeconfig is not None:
            if not Path(kubeconfig).is_file():
                raise ClusterConfigError(f"kubeconfig {kubeconfig}: no such file")
            k8s_config.load_kube_config(config_file=kubeconfig,
                                        client_configuration=configuration)
            return ClusterConfig(k8s_client.ApiClient(configuration), f"kubeconfig {kubeconfig}")
        if environ.get("KUBERNETES_SERVICE_HOST") and Path(token_file).is_file():
            k8s_config.load_incluster_config(client_configuration=configuration)
            return ClusterConfig(k8s_client.ApiClient(configuration), "in-cluster service account")
        for candidate in _kubeconfig_candidates(environ):
            if Path(candidate).is_file():
                k8s_config.load_kube_config(config_file=candidate,
                                            client_configuration=configuration)
                return ClusterConfig(k8s_client.ApiClient(configuration),
                                     f"kubeconfig {candidate}")
    except yaml.YAMLError as exc:  # the client parses the kubeconfig with PyYAML
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ClusterConfigError(f"cluster configuration cannot be used: the kubeconfig is not "
                                 f"valid YAML{where}: {problem}") from None
    except (ConfigException, OSError, ValueError, TypeError, AttributeError) as exc:
        # AttributeError/TypeError: a kubeconfig of the wrong shape (clusters: 5)
        raise ClusterConfigError(f"cluster configuration cannot be used: {exc} (expected a "
                                 "kubeconfig: clusters, users and contexts as lists of named "
                                 "entries)") from None
    return None
