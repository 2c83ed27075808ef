"""Where the examples shipped with gpuguard are: the snapshot ``gpuguard audit -f`` can read and
the AdmissionReview ``gpuguard serve --dev`` prints curl commands for.

They live in the repository's ``examples/``; ``gpuguard/examples`` links to it so that the wheel
carries them as data of the ``gpuguard`` package (pyproject.toml's package-data). The same paths
therefore hold in a checkout, an editable install, a wheel install and the image. This module
only names paths: it reads nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The examples directory: the link resolved (the repository's ``examples/``) in a checkout, the
#: package's data directory in a wheel install.
EXAMPLES = (Path(__file__).resolve().parent / "examples").resolve()

#: The example cluster snapshot (15 nodes, 60 pods; examples/cluster/README.md), a directory of
#: ``kubectl get -o yaml`` files.
CLUSTER_SNAPSHOT = EXAMPLES / "cluster"

#: The DCGM exporter metrics (Prometheus text) that go with :data:`CLUSTER_SNAPSHOT`.
CLUSTER_METRICS = CLUSTER_SNAPSHOT / "metrics" / "dcgm-exporter.prom"

#: A GPU pod's AdmissionReview (admission.k8s.io/v1), for ``serve --dev``.
ADMISSION_REVIEW = EXAMPLES / "admission" / "gpu-pod-review.json"


def shown(path: Path, cwd: str | None = None) -> str:
    """``path`` as a user would type it: relative to ``cwd`` (default: the current directory)
    when it lies below it (``examples/cluster`` in a checkout), else absolute (a wheel install).
    """
    here = Path(os.getcwd() if cwd is None else cwd).resolve()
    try:
        return str(path.relative_to(here))
    except ValueError:
        return str(path)
