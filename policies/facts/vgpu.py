"""NVIDIA vGPU types as shares of their physical GPU: the framebuffer table.

Owns the reading of a vGPU type resource name (KubeVirt ``permittedHostDevices.mediatedDevices``:
``nvidia.com/GRID_A100-4C``, ``nvidia.com/NVIDIA_A10-24Q``) into board, framebuffer and series,
and its share of one physical GPU: the type's framebuffer over the framebuffer of one GPU of the
board, from ``policies/data/vgpu_types.yaml`` (NVIDIA Virtual GPU Software User Guide, "Virtual
GPU Types for Supported GPUs"). ``nvidia.com/GRID_A100-4C`` is 4 GB of a 40 GB A100: 1/10; a
MIG-backed type (``nvidia.com/GRID_A100-1-5C``, on a 1g.5gb instance) is valued as its MIG
instance, 1/7.

Must not look at pods or nodes, nor decide which names are vGPUs (that is
:mod:`policies.facts.resource_names`); the only I/O is the shipped table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

from policies.sources import load_package_yaml

# "<board>-[<compute slices>-]<GB><series>" after KubeVirt's "GRID_" / "NVIDIA_" (the mdev type
# name's first word); "-0Q" / "-0B" (Maxwell) types have 512 MB; the slices are MIG-backed types'.
_TYPE = re.compile(r"nvidia\.com/(?:GRID_|NVIDIA_)(?P<board>[A-Za-z0-9]+)-"
                   r"(?:(?P<slices>\d+)-)?(?P<gb>\d+)(?P<series>[QABC])")


@dataclass(frozen=True)
class VGPUType:
    """One vGPU type: ``board`` (``A100``), framebuffer in GB (``Fraction(1, 2)`` for 0Q / 0B),
    ``series`` (Q virtual workstation, A virtual applications, B virtual PC, C compute), and
    ``mig_slices``: the compute slices of the MIG instance a MIG-backed type runs on (None for
    a time-sliced type)."""

    board: str
    framebuffer_gb: Fraction
    series: str
    mig_slices: int | None = None


def parse(resource: str) -> VGPUType | None:
    """The vGPU type a resource name stands for, or None when it is not one."""
    found = _TYPE.fullmatch(resource)
    if found is None:
        return None
    gb = int(found.group("gb"))
    slices = found.group("slices")
    return VGPUType(found.group("board"), Fraction(gb) if gb else Fraction(1, 2),
                    found.group("series"), int(slices) if slices else None)


@dataclass(frozen=True)
class _Board:
    framebuffer_gb: Fraction
    mig_compute_slices: int | None


@cache
def _boards() -> dict[str, _Board]:
    data = load_package_yaml("policies.data", "vgpu_types.yaml")
    return {str(board): _Board(Fraction(row["framebuffer_gb"]), row.get("mig_compute_slices"))
            for board, row in data["boards"].items()}


def share(resource: str) -> tuple[Fraction | None, str]:
    """The share of one physical GPU one unit of the vGPU type ``resource`` is.

    Returns:
        ``(share, "")`` — ``(Fraction(1, 10), "")`` for ``nvidia.com/GRID_A100-4C``, ``(Fraction(1,
        7), "")`` for the MIG-backed ``nvidia.com/GRID_A100-1-5C`` — or
        ``(None, reason)`` when the name is no vGPU type, its board is not in the table, or its
        framebuffer exceeds the board's; the reason names the resource.
    """
    vgpu = parse(resource)
    if vgpu is None:
        return None, f"vGPU type {resource}: not a '<board>-<GB><series>' vGPU type name"
    board = _boards().get(vgpu.board)
    if board is None:
        return None, (f"vGPU type {resource}: board {vgpu.board} is not in gpuguard's vGPU "
                      "table, so its share of a GPU is unknown")
    if vgpu.mig_slices is not None:  # MIG-backed: valued as its MIG instance, by compute
        total = board.mig_compute_slices
        if total is None or not 0 < vgpu.mig_slices <= total:
            return None, (f"vGPU type {resource}: {vgpu.mig_slices} compute slices is no MIG "
                          f"instance of a {vgpu.board} GPU")
        return Fraction(vgpu.mig_slices, total), ""
    if vgpu.framebuffer_gb > board.framebuffer_gb:
        return None, (f"vGPU type {resource}: {vgpu.framebuffer_gb} GB is more than the "
                      f"{board.framebuffer_gb} GB of one {vgpu.board} GPU")
    return vgpu.framebuffer_gb / board.framebuffer_gb, ""
