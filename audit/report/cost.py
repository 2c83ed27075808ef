"""What idle and stranded GPUs cost: GPU-equivalents turned into GPU-hours and money.

Owns the ``cost`` section of the report (docs/audit-report.md#cost-with---prices):

- :func:`waste`: the price-independent figures of one report — idle GPU-equivalents per team,
  namespace and GPU product (from ``utilization.devices_detail``: an idle device's
  GPU-equivalents split between its pods, as ``utilization.teams`` splits them) and stranded
  GPU-equivalents per node and product (``stranded[]``, both causes). The history keeps these
  per run (:mod:`audit.report.history`), so runs recorded before a price table existed are
  priced with it later;
- :func:`rate`: this run's figures priced per hour with a :class:`audit.prices.PriceTable`;
- :func:`window`: the figures of the recorded runs integrated over time — between two
  consecutive runs the GPU-equivalents are taken to move linearly from one run's figure to the
  next (the trapezoid rule: the mean of the two times the hours between them), priced with this
  run's table;
- :func:`section`: the section itself.

A GPU-equivalent is priced at its product's per-GPU-hour price (a MIG slice or a shared replica
costs its fraction of the GPU) or, without an entry, at the table's per-GPU-equivalent default;
with neither it is *unpriced*: counted in ``unpriced_*`` figures and listed per product, never
priced at 0. The product is the node's ``nvidia.com/gpu.product`` (suffixes off, as
:mod:`audit.prices` matches it); a device on a node outside the snapshot has none.

Must not read input or render. Money is rounded to 4 decimals, GPU-equivalents and GPU-hours to 6.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from audit.prices import Price, PriceTable
from policies.policy.quota import product_key


@dataclass(frozen=True)
class Waste:
    """One run's idle and stranded GPU-equivalents, unpriced.

    Attributes:
        idle_known: whether the run knew idle GPUs (it had DCGM metrics).
        idle: ``(team, namespace, product, GPU-equivalents)`` rows (None: unlabelled team,
            unknown product).
        stranded: ``(node, product, GPU-equivalents)`` rows.
        stranded_unknown: nodes with stranded GPUs of an unknown size (not counted).
    """

    idle_known: bool
    idle: tuple[tuple[str | None, str | None, str | None, float], ...] = ()
    stranded: tuple[tuple[str, str | None, float], ...] = ()
    stranded_unknown: tuple[str, ...] = ()


def _products(report: Mapping[str, Any]) -> dict[str, str | None]:
    return {n["name"]: product_key(n["product"]) if n.get("product") else None
            for n in report.get("nodes", [])}


def waste(report: Mapping[str, Any]) -> Waste:
    """The idle and stranded GPU-equivalents of a report (module docstring)."""
    products = _products(report)
    utilization = report.get("utilization")
    idle: dict[tuple[str | None, str | None, str | None], float] = defaultdict(float)
    for device in (utilization or {}).get("devices_detail", []):
        if not device["idle"] or not device["pods"]:
            continue
        share = device["gpu_equivalents"] / len(device["pods"])
        product = products.get(device["node"]) if device["node"] else None
        for pod in device["pods"]:
            idle[(pod.get("team"), pod["namespace"], product)] += share
    stranded, unknown = [], []
    for entry in report.get("stranded", []):
        if entry["gpu_equivalents"] is None:
            unknown.append(entry["node"])
        elif entry["gpu_equivalents"] > 0:
            stranded.append((entry["node"], products.get(entry["node"]),
                             float(entry["gpu_equivalents"])))
    return Waste(utilization is not None,
                 tuple((*key, round(value, 6)) for key, value in sorted(
                     idle.items(), key=lambda kv: tuple(str(k) for k in kv[0]))),
                 tuple(sorted(stranded, key=lambda r: r[0])), tuple(sorted(unknown)))


def _money(value: float) -> float:
    return round(float(value), 4)


def _eq(value: float) -> float:
    return round(float(value), 6)


class _Ledger:
    """GPU-equivalents (or GPU-hours) summed per key, with what they cost."""

    def __init__(self, table: PriceTable) -> None:
        self.table = table
        self.prices: dict[str | None, Price | None] = {}
        self.amount: dict[Any, float] = defaultdict(float)
        self.cost: dict[Any, float] = defaultdict(float)
        self.unpriced: dict[Any, float] = defaultdict(float)

    def price(self, product: str | None) -> Price | None:
        if product not in self.prices:
            self.prices[product] = self.table.price(product)
        return self.prices[product]

    def add(self, key: Any, product: str | None, amount: float) -> None:
        self.amount[key] += amount
        price = self.price(product)
        if price is None:
            self.unpriced[key] += amount
        else:
            self.cost[key] += amount * price.per_gpu_equivalent_hour

    def cost_of(self, key: Any) -> float | None:
        """The money of ``key``: None when it has GPU-equivalents and none of them is priced
        (0 would read as "free")."""
        if self.amount[key] and key not in self.cost:
            return None
        return _money(self.cost.get(key, 0.0))

    def total(self) -> tuple[float, float | None, float]:
        amount, unpriced = sum(self.amount.values()), sum(self.unpriced.values())
        cost = _money(sum(self.cost.values())) if self.cost or not amount else None
        return amount, cost, unpriced


class _Idle:
    """Idle GPU-equivalents (or GPU-hours) per team, per namespace and per product, priced: what
    :func:`rate` and :func:`window` both add up, and the one builder of their ``teams`` and
    ``namespaces`` rows."""

    def __init__(self, table: PriceTable) -> None:
        self.teams, self.namespaces, self.products = _Ledger(table), _Ledger(table), \
            _Ledger(table)

    def add(self, team: str | None, namespace: str | None, product: str | None,
            amount: float) -> None:
        self.teams.add(team, product, amount)
        self.namespaces.add((namespace, team), product, amount)
        self.products.add(product, product, amount)

    def rows(self, unit: str, cost_key: str) -> tuple[list[dict[str, Any]],
                                                      list[dict[str, Any]]]:
        """``(teams, namespaces)`` rows: ``{team, idle_<unit>, idle_<cost_key>,
        unpriced_<unit>}`` by team (no team last), and the same with ``namespace`` first by
        namespace; ``unit`` is ``gpu_equivalents`` (a rate, ``cost_key`` ``cost_per_hour``) or
        ``gpu_hours`` (a window, ``cost``), as :func:`_products_list` names them."""
        def figures(ledger: _Ledger, key: Any) -> dict[str, Any]:
            return {f"idle_{unit}": _eq(ledger.amount[key]),
                    f"idle_{cost_key}": ledger.cost_of(key),
                    f"unpriced_{unit}": _eq(ledger.unpriced[key])}

        teams = [{"team": team, **figures(self.teams, team)}
                 for team in sorted(self.teams.amount, key=lambda t: (t is None, t or ""))]
        namespaces = [{"namespace": ns, "team": team, **figures(self.namespaces, (ns, team))}
                      for ns, team in sorted(self.namespaces.amount,
                                             key=lambda k: (str(k[0]), str(k[1])))]
        return teams, namespaces


def _products_list(table: PriceTable, idle: Mapping[str | None, float],
                   stranded: Mapping[str | None, float], unit: str,
                   cost_key: str) -> list[dict[str, Any]]:
    rows = []
    for product in sorted(set(idle) | set(stranded), key=lambda p: (p is None, p or "")):
        price = table.price(product)
        row: dict[str, Any] = {
            "product": product,
            "price_per_gpu_hour": price.per_gpu_equivalent_hour if price else None,
            "priced_by": price.by if price else None}
        for state, amounts in (("idle", idle), ("stranded", stranded)):
            amount = amounts.get(product, 0.0)
            row[f"{state}_{unit}"] = _eq(amount)
            row[f"{state}_{cost_key}"] = _money(amount * price.per_gpu_equivalent_hour) \
                if price else None
        rows.append(row)
    return rows


def rate(table: PriceTable, figures: Waste) -> dict[str, Any]:
    """``cost.rate``: this run's idle and stranded GPU-equivalents and what they cost per hour.

    Returns:
        ``{idle, stranded, teams[], namespaces[], products[], unpriced[]}``; ``idle`` is None
        and ``teams`` / ``namespaces`` empty when the run did not know idle GPUs.
    """
    idle = _Idle(table)
    for team, namespace, product, amount in figures.idle:
        idle.add(team, namespace, product, amount)
    stranded = _Ledger(table)
    for _, product, amount in figures.stranded:
        stranded.add(product, product, amount)

    def line(ledger: _Ledger) -> dict[str, Any]:
        amount, cost, unpriced = ledger.total()
        return {"gpu_equivalents": _eq(amount), "cost_per_hour": cost,
                "unpriced_gpu_equivalents": _eq(unpriced)}

    products = _products_list(table, idle.products.amount, stranded.amount, "gpu_equivalents",
                              "cost_per_hour")
    teams, namespaces = idle.rows("gpu_equivalents", "cost_per_hour")
    return {
        "idle": line(idle.products) if figures.idle_known else None,
        "stranded": {**line(stranded), "nodes_unknown": list(figures.stranded_unknown)},
        "teams": teams,
        "namespaces": namespaces,
        "products": products,
        "unpriced": [{"product": p["product"], "idle_gpu_equivalents": p["idle_gpu_equivalents"],
                      "stranded_gpu_equivalents": p["stranded_gpu_equivalents"]}
                     for p in products if p["priced_by"] is None],
    }


def _time(at: str) -> datetime.datetime:
    when = datetime.datetime.fromisoformat(at.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def _idle_by_key(figures: Waste) -> dict[tuple[str | None, str | None, str | None], float]:
    return {(team, ns, product): amount for team, ns, product, amount in figures.idle}


def _stranded_by_product(figures: Waste) -> dict[str | None, float]:
    out: dict[str | None, float] = defaultdict(float)
    for _, product, amount in figures.stranded:
        out[product] += amount
    return out


def window(table: PriceTable, runs: Sequence[tuple[str, Waste | None]]) -> dict[str, Any] | None:
    """``cost.window``: GPU-hours and money over the recorded runs (trapezoid rule, module
    docstring).

    Args:
        table: the price table of this run (every run is priced with it).
        runs: ``(ISO time, figures)`` of the recorded runs, oldest first, this one last; figures
            None for a run recorded before the history kept them (schema 3 or older).

    Returns:
        ``{start, end, runs, hours, idle, stranded, teams[], namespaces[], products[],
        series[]}`` (docs/audit-report.md), or None without runs. An interval counts for idle
        GPUs only when both its runs knew them, for stranded GPUs when both runs have figures;
        ``hours_covered`` says how much of ``hours`` that is. Intervals of 0 or negative length
        (a clock set back) count nothing.
    """
    if not runs:
        return None
    times = [_time(at) for at, _ in runs]
    idle, stranded = _Idle(table), _Ledger(table)
    idle_hours = stranded_hours = 0.0
    for index in range(1, len(runs)):
        hours = (times[index] - times[index - 1]).total_seconds() / 3600
        before, after = runs[index - 1][1], runs[index][1]
        if hours <= 0 or before is None or after is None:
            continue
        stranded_hours += hours
        left, right = _stranded_by_product(before), _stranded_by_product(after)
        for product in set(left) | set(right):
            stranded.add(product, product,
                         (left.get(product, 0.0) + right.get(product, 0.0)) / 2 * hours)
        if not (before.idle_known and after.idle_known):
            continue
        idle_hours += hours
        left_idle, right_idle = _idle_by_key(before), _idle_by_key(after)
        for key in set(left_idle) | set(right_idle):
            team, namespace, product = key
            idle.add(team, namespace, product,
                     (left_idle.get(key, 0.0) + right_idle.get(key, 0.0)) / 2 * hours)

    def line(ledger: _Ledger, covered: float) -> dict[str, Any]:
        amount, cost, unpriced = ledger.total()
        return {"hours_covered": round(covered, 6), "gpu_hours": _eq(amount),
                "cost": cost, "unpriced_gpu_hours": _eq(unpriced)}

    teams, namespaces = idle.rows("gpu_hours", "cost")
    series = []
    for at, figures in runs:
        point: dict[str, Any] = {"at": at, "idle_gpu_equivalents": None,
                                 "idle_cost_per_hour": None, "stranded_gpu_equivalents": None,
                                 "stranded_cost_per_hour": None}
        if figures is not None:
            now = rate(table, figures)
            point["stranded_gpu_equivalents"] = now["stranded"]["gpu_equivalents"]
            point["stranded_cost_per_hour"] = now["stranded"]["cost_per_hour"]
            if now["idle"] is not None:
                point["idle_gpu_equivalents"] = now["idle"]["gpu_equivalents"]
                point["idle_cost_per_hour"] = now["idle"]["cost_per_hour"]
        series.append(point)
    return {
        "start": runs[0][0], "end": runs[-1][0], "runs": len(runs),
        "hours": round((times[-1] - times[0]).total_seconds() / 3600, 6),
        "idle": line(idle.products, idle_hours),
        "stranded": line(stranded, stranded_hours),
        "teams": teams,
        "namespaces": namespaces,
        "products": _products_list(table, idle.products.amount, stranded.amount, "gpu_hours",
                                   "cost"),
        "series": series,
    }


def section(report: Mapping[str, Any], table: PriceTable) -> dict[str, Any]:
    """The ``cost`` section of a report priced with ``table``; ``window`` None (the history
    fills it: :func:`window`)."""
    return {"currency": table.currency, "price_table": table.describe(),
            "rate": rate(table, waste(report)), "window": None}
