"""Turn command-line values into the frozen settings objects passed down to the layers."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from policies.facts.resource_names import GPUSettings

# An extended resource name: a DNS-subdomain domain, a slash, then a name (Kubernetes API rules).
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def gpu_settings_from_args(
    gpu_resources: Sequence[str], shared_replicas: Sequence[str]
) -> GPUSettings:
    """Build :class:`GPUSettings` from ``--gpu-resource`` and ``--shared-replicas`` values.

    Raises:
        ValueError: a name is not an extended resource name, or a replica count is not an
            integer above 1; the message names the flag and the value.
    """
    for name in gpu_resources:
        if not _RESOURCE.match(name):
            raise ValueError(
                f"--gpu-resource {name!r}: expected an extended resource name like "
                "'vendor.example/gpu'"
            )
    replicas: list[tuple[str, int]] = []
    for item in shared_replicas:
        resource, _, count = item.partition("=")
        if not _RESOURCE.match(resource) or not count.isdigit() or int(count) < 2:
            raise ValueError(
                f"--shared-replicas {item!r}: expected RESOURCE=N with N >= 2, "
                "e.g. nvidia.com/gpu.shared=4"
            )
        replicas.append((resource, int(count)))
    return GPUSettings(extra_whole_resources=tuple(gpu_resources), shared_replicas=tuple(replicas))


def add_gpu_settings(parser: argparse.ArgumentParser) -> None:
    """The flags every GPU-aware command shares (see :func:`gpu_settings_from_args`)."""
    parser.add_argument(
        "--gpu-resource", action="append", default=[], metavar="NAME",
        help="extra extended resource counted as one whole GPU (repeatable), "
        "e.g. gpu-vendor.example/example-gpu",
    )
    parser.add_argument(
        "--shared-replicas", action="append", default=[], metavar="RESOURCE=N",
        help="time-slicing/MPS replicas per GPU for a shared resource (repeatable), "
        "e.g. nvidia.com/gpu.shared=4",
    )
