"""The auditor's settings: one frozen value built by the CLI and passed down, never global state."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from audit.prices import PriceTable
from policies.facts.resource_names import DEFAULT_SETTINGS, GPUSettings

DEFAULT_TEAM_LABEL = "gpuguard.io/team"
#: Files larger than this (bytes, decompressed) are read item by item instead of all at once.
DEFAULT_STREAM_ABOVE = 8 << 20
#: KAI Scheduler's namespace for the pods that hold the GPUs its fractional pods share.
KAI_RESERVATION_NAMESPACE = "kai-resource-reservation"


@dataclass(frozen=True)
class AuditSettings:
    """How to audit.

    Attributes:
        gpu: GPU resource naming and sharing (``--gpu-resource``, ``--shared-replicas``).
        team_label: the Namespace label whose value names the team (``--team-label``).
        idle_below: an allocated GPU whose mean utilization over the metrics window is below this
            ratio (0-1; 0.05 = 5 %) counts as idle.
        now: the audit's time (exception expiry, report timestamps); the CLI reads the clock.
        jobs: worker processes evaluating policies next to the one reading the snapshot (0: in
            this process).
        stream_above: files above this many bytes are parsed item by item (memory stays flat).
        mutation_patches: also keep, per workload, the RFC 6902 patch its mutations would apply
            (``gpuguard diff`` compares them; the audit itself lists mutations as findings only,
            so it does not pay for the diff).
        prices: the ``--prices`` table: idle and stranded GPUs are priced in the report's
            ``cost`` section and the controller's cost metrics (None: no ``cost``).
    """

    gpu: GPUSettings = DEFAULT_SETTINGS
    team_label: str = DEFAULT_TEAM_LABEL
    idle_below: float = 0.05
    now: datetime.datetime = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    jobs: int = 0
    stream_above: int = DEFAULT_STREAM_ABOVE
    mutation_patches: bool = False
    prices: PriceTable | None = None
