"""The MIG catalog: GPU-instance profiles per GPU model, profile names, product labels, layouts.

Owns the facts about NVIDIA Multi-Instance GPU that admission and audit both need:

- the profile-name grammar (``1g.10gb``, ``1c.3g.20gb``, ``1g.10gb+me``, ``1g.24gb-me``) and the
  mixed-strategy extended resource names built from it (``nvidia.com/mig-1g.10gb.me``);
- the per-model profile tables (compute slices, memory slices, max instances, placements), always
  keyed by **(GPU model, profile)**: the same name means different geometry on different GPUs;
- recognising the GPU model from a GFD ``nvidia.com/gpu.product`` label, an NVML device name or a
  GKE ``cloud.google.com/gke-accelerator`` label;
- GPU-equivalents of one MIG instance (an exact :class:`~fractions.Fraction`) and whether a set of
  GPU instances fits on one GPU (placement rules of the MIG User Guide).

The facts live in ``policies/data/mig_profiles.yaml`` (MIG User Guide v580 and NVIDIA/mig-parted
``config-default.yaml``, via the project's GPU reference), loaded once through
:func:`policies.sources.load_package_yaml`. This module must not do any other I/O, import anything
outside the pure core, or raise for unknown input: unknown models, profiles or labels give
``None`` / ``False`` (with a reason where one helps). Only a malformed packaged catalog raises.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from policies.sources import load_package_yaml

__all__ = [
    "GpuModel",
    "MigProfile",
    "ProductLabel",
    "ProfileName",
    "equivalents",
    "gpu_model",
    "layout_problem",
    "lookup",
    "model_from_gke_accelerator",
    "model_from_name",
    "models",
    "models_with_profile",
    "parse_product",
    "parse_profile",
    "profile_from_resource",
    "profiles_for",
    "slices_per_gpu",
    "valid_layout",
]

#: Slices assumed for a profile whose GPU model is unknown (the data-centre MIG layout).
DEFAULT_COMPUTE_SLICES = 7

_POSITIVE = frozenset({"me", "me.all", "gfx"})
_NEGATIVE = frozenset({"me"})
_MEDIA = frozenset({"+me", "+me.all"})

_NUM = r"[1-9][0-9]*"
_PROFILE = re.compile(
    rf"(?:(?P<c>{_NUM})c\.)?(?P<g>{_NUM})g\.(?P<gb>{_NUM})gb(?:(?P<sign>[+-])(?P<attrs>.+))?"
)
# Mixed-strategy resource: '+' written as '.', '-me' kept; '.shared' from renameByDefault.
_RESOURCE = re.compile(
    rf"nvidia\.com/mig-(?P<p>{_NUM}g\.{_NUM}gb)(?P<a>\.me\.all|\.me|\.gfx|-me)?(?P<s>\.shared)?"
)
# Profile inside a product label: GFD drops '+' when sanitising, so accept '+x', '.x' and 'x'.
_LABEL_PROFILE = re.compile(
    rf"(?P<p>(?:{_NUM}c\.)?{_NUM}g\.{_NUM}gb)(?:[+.]?(?P<a>me\.all|me|gfx)|(?P<n>-me))?",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ProfileName:
    """A parsed MIG profile name (grammar of go-nvlib ``mig_profile.go``, reference section 1.1).

    Attributes:
        gi_slices: G, compute slices of the GPU instance.
        ci_slices: C, compute slices of the compute instance (equals G when the name has no
            ``<C>c.`` prefix).
        memory_gb: the GB figure in the name (rounded; not a slice count).
        attributes: signed attribute tokens, sorted: ``("+me",)``, ``("+me.all",)``, ``("+gfx",)``
            or ``("-me",)``; empty for a plain profile.
        canonical: the normalised name, e.g. ``1g.10gb+me`` (``3c.3g.20gb`` becomes ``3g.20gb``).

    """

    gi_slices: int
    ci_slices: int
    memory_gb: int
    attributes: tuple[str, ...]
    canonical: str

    @property
    def is_compute_instance(self) -> bool:
        """True for a CI sub-profile (C < G), which the device plugin never advertises."""
        return self.ci_slices < self.gi_slices

    @property
    def has_media_extension(self) -> bool:
        """True for ``+me`` / ``+me.all``: at most one such instance fits on a GPU."""
        return any(a in _MEDIA for a in self.attributes)


@dataclass(frozen=True)
class GpuModel:
    """One MIG-capable GPU model of the catalog.

    Attributes:
        key: catalog key, e.g. ``A100-40GB``.
        compute_slices: SM slices of the whole GPU (7, or 4 on A30 / RTX PRO 6000).
        memory_slices: memory slices of the whole GPU (8, or 4).
        memory_gb: GB in the name of the whole-GPU profile (usable memory, GB).
        verified: False where the reference marks the profile table UNVERIFIED.
        placements_verified: False where the placement table is only assumed for this model.
        source: where the profile rows come from (MIG User Guide v580 / mig-parted).
        products: NVML / GFD product names recognised as this model.
        gke_accelerators: ``cloud.google.com/gke-accelerator`` values of this model.

    """

    key: str
    compute_slices: int
    memory_slices: int
    memory_gb: int
    verified: bool
    placements_verified: bool
    source: str
    products: tuple[str, ...]
    gke_accelerators: tuple[str, ...]


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile on one GPU model (MIG User Guide v580 tables; mig-parted).

    Attributes:
        model: catalog key of the GPU model.
        name: canonical profile name, e.g. ``1g.10gb+me``.
        compute_slices: C, SM slices used.
        memory_slices: M, memory slices used.
        max_instances: most instances of this profile on one GPU.
        placements: allowed start indexes on the memory-slice axis (``nvidia-smi mig -lgipp``).
        placement_size: memory slices one placement occupies.
        memory_gb: the GB figure in the profile name.
        total_compute_slices: compute slices of the whole GPU.
        total_memory_slices: memory slices of the whole GPU.
        verified: False where the reference marks this row UNVERIFIED.
        placements_verified: False where the placements are only assumed for this model.
        source: where the row comes from.

    """

    model: str
    name: str
    compute_slices: int
    memory_slices: int
    max_instances: int
    placements: tuple[int, ...]
    placement_size: int
    memory_gb: int
    total_compute_slices: int
    total_memory_slices: int
    verified: bool
    placements_verified: bool
    source: str

    @property
    def equivalents(self) -> Fraction:
        """GPU-equivalents of one instance: compute slices / the GPU's compute slices."""
        return Fraction(self.compute_slices, self.total_compute_slices)


@dataclass(frozen=True)
class ProductLabel:
    """A normalised ``nvidia.com/gpu.product`` value (GFD, reference section 3).

    Attributes:
        raw: the value as given.
        base: the product without the ``-MIG-…`` and ``-SHARED`` suffixes (spaces turned into
            ``-``), e.g. ``NVIDIA-A100-SXM4-40GB``.
        model: catalog key of the GPU model, or None when it is not a MIG-capable model we know.
        mig_profile: the single-strategy ``-MIG-<profile>`` suffix, canonical when it parses
            (GFD drops ``+``, so ``1g.10gbme`` gives ``1g.10gb+me``), else as written; None
            without that suffix.
        mig_invalid: True for ``-MIG-INVALID`` (single strategy misconfigured; nothing schedulable).
        shared: True for the ``-SHARED`` suffix (time-slicing / MPS without renaming).

    """

    raw: str
    base: str
    model: str | None
    mig_profile: str | None
    mig_invalid: bool
    shared: bool


@dataclass(frozen=True)
class _Catalog:
    models: dict[str, GpuModel]
    profiles: dict[str, dict[str, MigProfile]]
    products: dict[str, str]
    gke: dict[str, str]


# ---------------------------------------------------------------------------------------------
# Names


def parse_profile(name: str) -> ProfileName | None:
    """Parse ``<G>g.<GB>gb`` or ``<C>c.<G>g.<GB>gb`` with an optional ``+attrs`` or ``-me``.

    Positive attributes (comma-separated) are ``me``, ``me.all`` and ``gfx``; the only negative
    one is ``me``; a name never carries both ``+`` and ``-``. Case-insensitive.

    Returns:
        The parsed name, or None when ``name`` does not follow the grammar (or C > G).

    """
    if not isinstance(name, str):
        return None
    match = _PROFILE.fullmatch(name.strip().lower())
    if match is None:
        return None
    gi, gb = int(match["g"]), int(match["gb"])
    ci = int(match["c"]) if match["c"] else gi
    if ci > gi:
        return None
    attributes: tuple[str, ...] = ()
    if match["sign"]:
        names = match["attrs"].split(",")
        allowed = _POSITIVE if match["sign"] == "+" else _NEGATIVE
        if len(set(names)) != len(names) or not set(names) <= allowed:
            return None
        attributes = tuple(sorted(match["sign"] + n for n in names))
    prefix = f"{ci}c." if ci != gi else ""
    suffix = ""
    if attributes:
        suffix = attributes[0][0] + ",".join(a[1:] for a in attributes)
    return ProfileName(gi, ci, gb, attributes, f"{prefix}{gi}g.{gb}gb{suffix}")


def profile_from_resource(resource: str) -> tuple[str, bool] | None:
    """Profile of a mixed-strategy extended resource name (reference sections 2.2, 2.4).

    ``nvidia.com/mig-1g.10gb.me`` gives ``("1g.10gb+me", False)`` (the device plugin writes ``+``
    as ``.``), ``nvidia.com/mig-3g.20gb.shared`` gives ``("3g.20gb", True)`` (time-slicing with
    ``renameByDefault``).

    Returns:
        ``(canonical profile, shared)``, or None for any other name, including GFD label keys
        such as ``nvidia.com/mig-1g.5gb.count`` and compute-instance profiles.

    """
    if not isinstance(resource, str):
        return None
    match = _RESOURCE.fullmatch(resource)
    if match is None:
        return None
    attribute = match["a"] or ""
    if attribute.startswith("."):
        attribute = "+" + attribute[1:]
    parsed = parse_profile(match["p"] + attribute)
    return (parsed.canonical, bool(match["s"])) if parsed else None


def _product_key(name: str) -> str:
    """Return the matching key of a product name: upper case, ``-`` separators, no ``NVIDIA-``."""
    key = re.sub(r"[\s_-]+", "-", name.upper())
    key = re.sub(r"[^A-Z0-9.-]", "", key).strip("-")
    while key.startswith("NVIDIA-"):
        key = key[len("NVIDIA-") :]
    return key


def _label_profile(text: str) -> str:
    """Return the canonical profile of a ``-MIG-<profile>`` label suffix (else the text as is)."""
    match = _LABEL_PROFILE.fullmatch(text)
    if match is None:
        return text
    candidate = match["p"] + (f"+{match['a']}" if match["a"] else match["n"] or "")
    parsed = parse_profile(candidate)
    return parsed.canonical if parsed else text


def parse_product(label: str) -> ProductLabel:
    """Normalise a ``nvidia.com/gpu.product`` value (or an NVML device name).

    Recognises an optional ``NVIDIA-`` prefix (also repeated, as HAMi writes it), the
    single-strategy ``-MIG-<profile>`` and ``-MIG-INVALID`` suffixes and the ``-SHARED`` suffix
    (reference section 3), case-insensitively and treating spaces like ``-``.

    Returns:
        The normalised label; ``model`` is None for GPUs that are not MIG-capable models of the
        catalog (T4, L4, …) and for anything unrecognised.

    """
    raw = label if isinstance(label, str) else ""
    work = re.sub(r"\s+", "-", raw.strip())
    shared = work.upper().endswith("-SHARED")
    if shared:
        work = work[: -len("-SHARED")]
    base, mig_profile, mig_invalid = work, None, False
    cut = work.upper().rfind("-MIG-")
    if cut >= 0:
        base, tail = work[:cut], work[cut + len("-MIG-") :]
        if tail.upper() == "INVALID":
            mig_invalid = True
        else:
            mig_profile = _label_profile(tail)
    model = _catalog().products.get(_product_key(base))
    return ProductLabel(raw, base, model, mig_profile, mig_invalid, shared)


def model_from_name(nvml_name: str) -> str | None:
    """Catalog model of an NVML device name (``nvmlDeviceGetName``), e.g. ``NVIDIA H100 NVL``.

    MIG device names such as ``NVIDIA B200 MIG 1g.45gb`` give the parent GPU's model.

    Returns:
        The model key, or None when the name is not a MIG-capable model of the catalog.

    """
    return parse_product(nvml_name).model if isinstance(nvml_name, str) else None


def model_from_gke_accelerator(value: str) -> str | None:
    """Catalog model of a GKE ``cloud.google.com/gke-accelerator`` label value.

    Returns:
        The model key (``nvidia-tesla-a100`` gives ``A100-40GB``), or None when unknown.

    """
    if not isinstance(value, str):
        return None
    return _catalog().gke.get(value.strip().lower())


# ---------------------------------------------------------------------------------------------
# Catalog lookups


def models() -> tuple[str, ...]:
    """Catalog model keys, in catalog order."""
    return tuple(_catalog().models)


def gpu_model(model: str) -> GpuModel | None:
    """Return the catalog entry of a model key, or None when unknown."""
    return _catalog().models.get(model) if isinstance(model, str) else None


def slices_per_gpu(model: str) -> int | None:
    """Compute slices of one whole GPU of ``model`` (7, or 4), or None when the model is unknown."""
    entry = gpu_model(model)
    return entry.compute_slices if entry else None


def profiles_for(model: str) -> tuple[MigProfile, ...]:
    """Return every GPU-instance profile of ``model`` in catalog order (empty when unknown)."""
    if not isinstance(model, str):
        return ()
    return tuple(_catalog().profiles.get(model, {}).values())


def lookup(model: str, profile: str) -> MigProfile | None:
    """Return the facts of ``profile`` on ``model``: keyed by both, as names differ per model.

    Returns:
        The profile, or None when the model is unknown, the name does not parse or the model does
        not offer it.

    """
    parsed = parse_profile(profile)
    if parsed is None or not isinstance(model, str):
        return None
    return _catalog().profiles.get(model, {}).get(parsed.canonical)


def models_with_profile(profile: str) -> tuple[str, ...]:
    """Models offering ``profile`` (any spelling ``parse_profile`` accepts), in catalog order."""
    parsed = parse_profile(profile)
    if parsed is None:
        return ()
    return tuple(m for m, table in _catalog().profiles.items() if parsed.canonical in table)


def equivalents(profile: str, model: str | None) -> tuple[Fraction, bool]:
    """GPU-equivalents of one instance of ``profile``: compute slices / the GPU's compute slices.

    - ``model`` known and offering the profile: exact.
    - ``model`` None (or not in the catalog): exact when every catalog model offering the profile
      has the same slice count (``3g.20gb`` → 3/7, ``1g.6gb`` → 1/4); otherwise, or when no model
      offers it, G / 7 and approximate.
    - ``model`` known but not offering the profile: G / that model's slices, approximate.
    - an unparseable profile: 1 (a whole GPU, the upper bound), approximate.

    Returns:
        ``(equivalents, approximate)``.

    """
    parsed = parse_profile(profile)
    if parsed is None:
        return Fraction(1), True
    catalog = _catalog()
    entry = catalog.models.get(model) if isinstance(model, str) else None
    if entry is not None:
        found = catalog.profiles[entry.key].get(parsed.canonical)
        if found is not None:
            return found.equivalents, False
        return Fraction(parsed.gi_slices, entry.compute_slices), True
    totals = {catalog.models[m].compute_slices for m in models_with_profile(parsed.canonical)}
    if len(totals) == 1:
        return Fraction(parsed.gi_slices, totals.pop()), False
    return Fraction(parsed.gi_slices, DEFAULT_COMPUTE_SLICES), True


# ---------------------------------------------------------------------------------------------
# Layouts


def layout_problem(model: str, profiles: Mapping[str, int]) -> str | None:
    """Why the GPU instances ``{profile: count}`` cannot all exist on ONE GPU of ``model``.

    Rules (reference section 1.4): every instance gets an allowed placement start with no two
    instances sharing a memory slice, no profile exceeds its max count, and at most one ``+me`` /
    ``+me.all`` instance exists. Solved by backtracking over placements. Zero counts are ignored;
    an empty layout (MIG enabled, no instances) is valid.

    Returns:
        None when the layout is valid, else a one-line reason.

    """
    entry = gpu_model(model)
    if entry is None:
        return f"unknown GPU model {model!r}: not a MIG-capable model of the catalog"
    if not isinstance(profiles, Mapping):
        return "the layout must be a mapping of profile name to instance count"
    counts: dict[str, int] = {}
    for name, count in profiles.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            return f"count of {name!r} must be a non-negative integer, got {count!r}"
        found = lookup(entry.key, name)
        if found is None:
            offered = ", ".join(p.name for p in profiles_for(entry.key))
            return f"profile {name!r} is not offered by {entry.key} (offered: {offered})"
        counts[found.name] = counts.get(found.name, 0) + count
    table = _catalog().profiles[entry.key]
    items: list[MigProfile] = []
    for name, count in counts.items():
        if count > table[name].max_instances:
            return (
                f"{count} x {name} exceeds the maximum of {table[name].max_instances} per GPU "
                f"on {entry.key}"
            )
        items.extend([table[name]] * count)
    media = sum(1 for p in items if _has_media_extension(p.name))
    if media > 1:
        return f"{media} instances with +me / +me.all: at most one per GPU"
    compute = sum(p.compute_slices for p in items)
    if compute > entry.compute_slices:
        return f"needs {compute} compute slices, {entry.key} has {entry.compute_slices}"
    items.sort(key=lambda p: (-p.placement_size, len(p.placements), p.name))
    if not _place(items, 0, 0, -1):
        return f"no placement of these instances fits on one {entry.key} (MIG placement rules)"
    return None


def valid_layout(model: str, profiles: Mapping[str, int]) -> bool:
    """Whether the GPU instances ``{profile: count}`` fit on one GPU of ``model``.

    See :func:`layout_problem` for the rules and the reason when they do not.
    """
    return layout_problem(model, profiles) is None


def _has_media_extension(name: str) -> bool:
    """Whether a catalog profile name carries ``+me`` / ``+me.all``."""
    parsed = parse_profile(name)
    return parsed is not None and parsed.has_media_extension


def _place(items: list[MigProfile], index: int, used: int, previous_start: int) -> bool:
    """Give ``items[index:]`` placements avoiding the memory slices set in the bitmask ``used``.

    Identical consecutive profiles take increasing starts, so each combination is tried once.
    """
    if index == len(items):
        return True
    item = items[index]
    same = index > 0 and items[index - 1].name == item.name
    for start in item.placements:
        if same and start <= previous_start:
            continue
        mask = ((1 << item.placement_size) - 1) << start
        if not used & mask and _place(items, index + 1, used | mask, start):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Loading


def _field(data: Mapping[str, Any], name: str, kind: type, where: str) -> Any:
    """``data[name]`` checked to be a ``kind``; a wrong packaged catalog is a packaging bug."""
    value = data.get(name) if isinstance(data, Mapping) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"mig_profiles.yaml: {where}: {name!r} must be a {kind.__name__}")
    return value


@functools.cache
def _catalog() -> _Catalog:
    """Load and check ``policies/data/mig_profiles.yaml`` once.

    Raises:
        ValueError: the packaged catalog is malformed (a packaging bug).

    """
    data = load_package_yaml("policies.data", "mig_profiles.yaml")
    raw_models = _field(data, "models", dict, "top level")
    catalog = _Catalog({}, {}, {}, {})
    for key, raw in raw_models.items():
        where = f"models.{key}"
        entry = GpuModel(
            key=str(key),
            compute_slices=_field(raw, "compute_slices", int, where),
            memory_slices=_field(raw, "memory_slices", int, where),
            memory_gb=_field(raw, "memory_gb", int, where),
            verified=_field(raw, "verified", bool, where),
            placements_verified=_field(raw, "placements_verified", bool, where),
            source=_field(raw, "source", str, where),
            products=tuple(_field(raw, "products", list, where)),
            gke_accelerators=tuple(_field(raw, "gke_accelerators", list, where)),
        )
        catalog.models[entry.key] = entry
        catalog.profiles[entry.key] = {
            p.name: p
            for name, row in _field(raw, "profiles", dict, where).items()
            for p in (_profile(entry, str(name), row),)
        }
        names = [(catalog.products, _product_key(str(n))) for n in entry.products]
        names += [(catalog.gke, str(n).lower()) for n in entry.gke_accelerators]
        for index, name in names:
            if index.setdefault(name, entry.key) != entry.key:
                raise ValueError(f"mig_profiles.yaml: {name!r} is listed for two models")
    return catalog


def _profile(model: GpuModel, name: str, row: Mapping[str, Any]) -> MigProfile:
    """Build and check one profile row of ``model``."""
    where = f"models.{model.key}.profiles.{name}"
    parsed = parse_profile(name)
    if parsed is None or parsed.canonical != name or parsed.is_compute_instance:
        raise ValueError(f"mig_profiles.yaml: {where}: not a canonical GPU-instance profile name")
    starts = tuple(_field(row, "starts", list, where))
    size = _field(row, "size", int, where)
    profile = MigProfile(
        model=model.key,
        name=name,
        compute_slices=_field(row, "compute", int, where),
        memory_slices=_field(row, "memory", int, where),
        max_instances=_field(row, "max", int, where),
        placements=starts,
        placement_size=size,
        memory_gb=parsed.memory_gb,
        total_compute_slices=model.compute_slices,
        total_memory_slices=model.memory_slices,
        verified=_field(row, "verified", bool, where) if "verified" in row else model.verified,
        placements_verified=(
            _field(row, "placements_verified", bool, where)
            if "placements_verified" in row
            else model.placements_verified
        ),
        source=_field(row, "source", str, where) if "source" in row else model.source,
    )
    bad_starts = any(
        isinstance(s, bool) or not isinstance(s, int) or s < 0 or s + size > model.memory_slices
        for s in starts
    )
    if (
        bad_starts
        or not starts
        or profile.compute_slices != parsed.gi_slices
        or not 0 < profile.compute_slices <= model.compute_slices
        or not 0 < profile.memory_slices <= model.memory_slices
        or profile.max_instances < 1
    ):
        raise ValueError(f"mig_profiles.yaml: {where}: inconsistent slices or placements")
    return profile
