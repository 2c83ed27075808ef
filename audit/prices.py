"""The GPU price table (``--prices FILE``): what an hour of a GPU costs, per product or per
GPU-equivalent.

Owns the file's format (``apiVersion: gpuguard.io/v1alpha1``, ``kind: GPUPriceTable``; documented
in ``docs/audit-report.md#cost-with---prices``), its validation (every problem names the file and
the field, and the file is refused whole: nothing is priced at 0 because a field was misspelt),
and the lookup of the price of one GPU product. Products are matched the way GPUQuota product
limits match pinned pods (:func:`policies.policy.quota.product_key`: the
``nvidia.com/gpu.product`` value with the MIG-single ``-MIG-<profile>`` and ``-SHARED`` suffixes
off), so a MIG-single or time-sliced node is priced as its physical GPU, and a slice by its
GPU-equivalent share of it.

Must not compute costs (:mod:`audit.report.cost` does) or read anything but the one file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from policies.policy.quota import product_key
from policies.sources import load_yaml, read_text, yaml_problem
from policies.value_words import described

API_VERSION = "gpuguard.io/v1alpha1"
KIND = "GPUPriceTable"
_CURRENCY = re.compile(r"[A-Z]{3}")  # ISO 4217 alphabetic code
_SPEC_FIELDS = {"currency", "perGpuEquivalentHour", "models"}
_MODEL_FIELDS = {"product", "perGpuHour"}
#: Prices at or above this per GPU-hour are refused as a unit mistake (cents, a monthly price).
MAX_PRICE = 1_000_000.0


class PriceTableError(ValueError):
    """A price table that cannot be used; the message is ``FILE: FIELD: problem``."""


@dataclass(frozen=True)
class ModelPrice:
    """One ``spec.models[]`` entry: ``product`` as written, its match key, the price of one
    whole GPU of it per hour (currency units)."""

    product: str
    key: str
    per_gpu_hour: float


@dataclass(frozen=True)
class Price:
    """The price found for a product: per GPU-equivalent-hour, and what set it (``product``:
    the table entry as written, or ``default``: ``spec.perGpuEquivalentHour``)."""

    per_gpu_equivalent_hour: float
    by: str


@dataclass(frozen=True)
class PriceTable:
    """A validated price table.

    Attributes:
        source: the file it was read from.
        name: ``metadata.name`` (None when not given).
        currency: ISO 4217 code (``USD``, ``EUR``): every figure priced with it is in it.
        per_gpu_equivalent_hour: the default price of one GPU-equivalent for an hour, for
            products with no entry (None: those are reported unpriced).
        models: per product prices, in file order.
    """

    source: str
    currency: str
    per_gpu_equivalent_hour: float | None = None
    models: tuple[ModelPrice, ...] = ()
    name: str | None = None

    def price(self, product: str | None) -> Price | None:
        """The price of one GPU-equivalent-hour on a GPU of ``product`` (an
        ``nvidia.com/gpu.product`` value or an NVML device name; None: unknown), or None when
        the table prices neither it nor GPUs by default."""
        if product is not None:
            key = product_key(product)
            for entry in self.models:
                if entry.key == key:
                    return Price(entry.per_gpu_hour, entry.product)
        if self.per_gpu_equivalent_hour is not None:
            return Price(self.per_gpu_equivalent_hour, "default")
        return None

    def describe(self) -> dict[str, Any]:
        """The ``cost.price_table`` section of the report (docs/audit-report.md)."""
        return {"source": self.source, "name": self.name, "currency": self.currency,
                "per_gpu_equivalent_hour": self.per_gpu_equivalent_hour,
                "models": [{"product": m.product, "per_gpu_hour": m.per_gpu_hour}
                           for m in self.models]}


def _amount(value: Any, where: str, unit: str) -> float:
    """A price: a finite number ≥ 0 and below :data:`MAX_PRICE` of ``unit`` (``USD per
    GPU-hour``). A negative zero (``-0.0``) is refused with the negatives: it is a sign typed by
    mistake, and would be reported as a price of -0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or not 0 <= value < MAX_PRICE or \
            math.copysign(1.0, value) < 0:
        raise ValueError(f"{where}: expected a number ≥ 0 and below {MAX_PRICE:,.0f} ({unit}), "
                         f"got {described(value)}")
    return float(value)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a mapping, got {described(value)}")
    return value


def _unknown(fields: dict[str, Any], known: set[str], where: str) -> None:
    extra = sorted(str(k) for k in fields if k not in known)
    if extra:
        raise ValueError(f"{where}{extra[0]}: unknown field (expected "
                         f"{', '.join(sorted(known))})")


def parse_price_table(body: Any, source: str) -> PriceTable:
    """Validate a parsed price table document.

    Raises:
        PriceTableError: the first problem, as ``SOURCE: FIELD: problem``.
    """
    try:
        return _parse(body, source)
    except ValueError as exc:
        raise PriceTableError(f"{source}: {exc}") from None


def _parse(body: Any, source: str) -> PriceTable:
    document = _mapping(body, "the document")
    if document.get("apiVersion") != API_VERSION:
        raise ValueError(f"apiVersion: expected {API_VERSION}, got "
                         f"{described(document.get('apiVersion'))}")
    if document.get("kind") != KIND:
        raise ValueError(f"kind: expected {KIND}, got {described(document.get('kind'))}")
    _unknown(document, {"apiVersion", "kind", "metadata", "spec"}, "")
    metadata = _mapping(document.get("metadata") or {}, "metadata")
    name = metadata.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"metadata.name: expected a string, got {described(name)}")
    spec = _mapping(document.get("spec"), "spec")
    _unknown(spec, _SPEC_FIELDS, "spec.")
    currency = spec.get("currency")
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise ValueError(f"spec.currency: expected an ISO 4217 code such as USD or EUR, got "
                         f"{described(currency)}")
    default = spec.get("perGpuEquivalentHour")
    if "perGpuEquivalentHour" in spec:  # a null price is an error, not "no default"
        default = _amount(default, "spec.perGpuEquivalentHour",
                          f"{currency} per GPU-equivalent-hour")
    raw_models = spec.get("models") or []
    if not isinstance(raw_models, list):
        raise ValueError(f"spec.models: expected a list, got {described(raw_models)}")
    models: list[ModelPrice] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_models):
        where = f"spec.models[{index}]"
        entry = _mapping(raw, where)
        _unknown(entry, _MODEL_FIELDS, f"{where}.")
        product = entry.get("product")
        if not isinstance(product, str) or not product.strip():
            raise ValueError(f"{where}.product: expected an nvidia.com/gpu.product value such as "
                             f"NVIDIA-H100-80GB-HBM3, got {described(product)}")
        if "perGpuHour" not in entry:
            raise ValueError(f"{where}.perGpuHour: missing (the price of one whole GPU for an "
                             "hour)")
        key = product_key(product.strip())
        if key in seen:
            raise ValueError(f"{where}.product: {product!r} is priced twice (also "
                             f"spec.models[{seen[key]}])")
        seen[key] = index
        models.append(ModelPrice(product.strip(), key,
                                 _amount(entry["perGpuHour"], f"{where}.perGpuHour",
                                         f"{currency} per GPU-hour")))
    if default is None and not models:
        raise ValueError("spec: prices nothing (give spec.perGpuEquivalentHour, spec.models, "
                         "or both)")
    return PriceTable(source, currency, default, tuple(models), name)


def read_price_table(path: str) -> PriceTable:
    """Read and validate ``path`` (YAML or JSON, one document).

    Raises:
        PriceTableError: unreadable, not YAML, or not a valid price table (the message names
            the file, the line or field, and what was expected).
    """
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PriceTableError(f"{path}: cannot be read: {problem}") from None
    try:
        body = load_yaml(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc, 1, text)  # the file's first line is line 1
        where = f"line {line}: " if line is not None else ""
        raise PriceTableError(f"{path}: {where}{problem}") from None
    except RecursionError as exc:
        raise PriceTableError(f"{path}: not a YAML document ({exc})") from None
    if body is None:
        raise PriceTableError(f"{path}: empty (expected apiVersion: {API_VERSION}, kind: {KIND})")
    return parse_price_table(body, path)

