"""Connecting to a cluster for a command run: :func:`kube.config.detect`, plus a kubeconfig context.

Owns one thing :mod:`kube.config` does not offer: choosing a kubeconfig **context**
(``--context NAME``, as kubectl does). Without a context it defers to
:func:`kube.config.detect` (explicit kubeconfig, then the pod's service account, then
``$KUBECONFIG`` / ``~/.kube/config``).

Must not know about HTTP serving or policy semantics; only :mod:`kube` imports ``kubernetes``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from kube.config import ClusterConfig, ClusterConfigError, detect


def connect(kubeconfig: str | None = None, context: str | None = None, *,
            environ: Mapping[str, str] | None = None) -> ClusterConfig:
    """An API client for the cluster named by ``kubeconfig`` / ``context`` (or found around us).

    Raises:
        ClusterConfigError: no cluster is configured, the kubeconfig is missing or invalid, or
            the context does not exist (the message says which).
    """
    environ = os.environ if environ is None else environ
    if context is None:
        found = detect(kubeconfig, environ=environ)
        if found is None:
            raise ClusterConfigError(
                "no cluster configured: no in-cluster service account, no $KUBECONFIG and no "
                "~/.kube/config (give --kubeconfig FILE)")
        return found
    path = kubeconfig
    if path is None:
        listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        path = listed[0] if listed else str(Path("~/.kube/config").expanduser())
    if not Path(path).is_file():
        raise ClusterConfigError(f"kubeconfig {path}: no such file")
    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config(config_file=path, context=context,
                                    client_configuration=configuration)
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        raise ClusterConfigError(f"kubeconfig {path}, context {context}: {exc}") from None
    return ClusterConfig(k8s_client.ApiClient(configuration),
                         f"kubeconfig {path} (context {context})")
