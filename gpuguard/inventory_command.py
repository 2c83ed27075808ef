"""``gpuguard inventory``: read this machine's GPUs through NVML; print them, or annotate the Node.

Wires :mod:`audit.inventory.nvml` (the backend), :mod:`audit.inventory.nvml_reader` (the reading),
:mod:`audit.inventory.summary` (the annotation value) and :mod:`kube.node_annotations` (the
patch). Exit codes: 0 done; 2 usage, no usable cluster configuration, or the Node could not be
annotated (single run); 3 NVML is not available (one line on stderr says why).

With ``--interval`` the command runs until stopped (the DaemonSet in
``deploy/overlays/inventory-daemonset``): each round reads NVML, patches the annotation and logs
one line; a failed round is logged and retried at the next one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from audit.inventory.model import Inventory, mib
from audit.inventory.nvml import NvmlBackend, NvmlUnavailable, load_backend
from audit.inventory.nvml_reader import read_inventory
from audit.inventory.summary import ANNOTATION, summarize
from gpuguard.exit_codes import EXIT_ENVIRONMENT, EXIT_OK, EXIT_USAGE
from gpuguard.output_formats import write
from policies.facts.resource_names import GPUSettings
from policies.sources import printable

EXIT_FAILED = EXIT_USAGE
EXIT_NO_NVML = EXIT_ENVIRONMENT
PROG = "gpuguard inventory"

#: Sets annotations on a node: (node, {key: value}) -> None; raises :class:`AnnotateError`.
Annotate = Callable[[str, dict[str, str | None]], None]


class AnnotateError(Exception):
    """The cluster cannot be reached or refused the patch; ``str()`` is one line."""


def connect_annotator(kubeconfig: str | None) -> Annotate:
    """The real annotator: the cluster of ``kubeconfig`` or, in a pod, its service account.

    The kubernetes client is imported here, only when annotating (it takes ~0.3 s to load).

    Raises:
        AnnotateError: no cluster configured, or its configuration is unusable.
    """
    from kube.config import ClusterConfigError, detect  # noqa: PLC0415 - see above
    from kube.node_annotations import AnnotationError, NodeAnnotator  # noqa: PLC0415

    try:
        found = detect(kubeconfig)
    except ClusterConfigError as exc:
        raise AnnotateError(str(exc)) from None
    if found is None:
        raise AnnotateError("no cluster configured for --annotate-node: no in-cluster service "
                            "account, no $KUBECONFIG and no ~/.kube/config (give --kubeconfig "
                            "FILE)")
    annotator = NodeAnnotator(found.api_client)

    def annotate(node: str, annotations: dict[str, str | None]) -> None:
        try:
            annotator.annotate(node, annotations)
        except AnnotationError as exc:
            raise AnnotateError(str(exc)) from None

    return annotate


def _node_name(args: argparse.Namespace, environ: dict[str, str]) -> str:
    return args.node or args.annotate_node or environ.get("NODE_NAME") or platform.node()


def _cell(value: Any) -> str:
    return "-" if value is None else escape(printable(str(value)))


def render_table(inventory: Inventory, out: TextIO) -> None:
    """Print ``inventory`` as a table (GPUs, their MIG devices) and its NVML errors below it."""
    console = Console(file=out, width=160, highlight=False)
    title = (f"GPUs on {inventory.node or '?'} (driver {inventory.driver_version or '?'}, "
             f"CUDA {inventory.cuda_version or '?'}, {inventory.collected_at})")
    table = Table(title=escape(printable(title)))
    for column in ("GPU", "UUID", "name", "memory MiB used/total", "util %", "MIG",
                   "processes", "status"):
        table.add_column(column, overflow="fold")
    notes: list[str] = []
    for gpu in inventory.gpus:
        processes = gpu.all_processes()
        mig_mode = {True: gpu.mig.current, False: "n/a", None: None}[gpu.mig.capable]
        if gpu.mig.capable and gpu.mig.pending != gpu.mig.current:
            mig_mode = f"{gpu.mig.current} (pending {gpu.mig.pending})"
        table.add_row(
            str(gpu.index), _cell(gpu.uuid), _cell(gpu.name),
            f"{_cell(mib(gpu.memory_used_bytes))}/{_cell(mib(gpu.memory_total_bytes))}",
            _cell(gpu.utilization_gpu_percent), _cell(mig_mode),
            _cell(None if processes is None else len(processes)), _cell(gpu.status),
        )
        notes += [f"GPU {gpu.index}: {e.call}: {e.error} ({e.message})" for e in gpu.errors]
        for device in gpu.mig.devices:
            table.add_row(
                f"  {gpu.index}/{device.index}", _cell(device.uuid), _cell(device.profile),
                f"{_cell(mib(device.memory_used_bytes))}/{_cell(device.memory_total_mib)}",
                "-", f"GI {_cell(device.gpu_instance_id)} CI {_cell(device.compute_instance_id)}",
                _cell(None if device.processes is None else len(device.processes)), "",
            )
            notes += [f"GPU {gpu.index} MIG slot {device.index}: {e.call}: {e.error} "
                      f"({e.message})" for e in device.errors]
    console.print(table)
    notes += [f"{e.call}: {e.error} ({e.message})" for e in inventory.errors]
    for note in notes:
        console.print(f"- {printable(note)}", markup=False)


def run(
    args: argparse.Namespace,
    *,
    backend_loader: Callable[[], NvmlBackend] = load_backend,
    annotator: Callable[[str | None], Annotate] = connect_annotator,
    now: Callable[[], datetime.datetime] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    environ: dict[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    rounds: int | None = None,
) -> int:
    """``gpuguard inventory`` with its collaborators injectable (tests pass fakes).

    Args:
        rounds: stop a ``--interval`` loop after this many rounds (tests); None runs forever.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    environ = dict(os.environ) if environ is None else environ
    node = _node_name(args, environ)
    try:
        backend = backend_loader()
    except NvmlUnavailable as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return EXIT_NO_NVML
    annotate: Annotate | None = None
    if args.annotate_node:
        try:
            annotate = annotator(args.kubeconfig)
        except AnnotateError as exc:
            print(f"{PROG}: error: {exc}", file=err)
            return EXIT_FAILED
    if args.interval is None:
        return _once(args, backend, node, annotate, now, out, err)
    done = 0
    while rounds is None or done < rounds:
        code = _round(args, backend, node, annotate, now, out, err)
        if code == EXIT_NO_NVML and done == 0:
            return code  # never worked: let the pod restart with the reason in its log
        done += 1
        if rounds is None or done < rounds:
            sleep(args.interval)
    return EXIT_OK


def _read(backend: NvmlBackend, node: str, now: Callable[[], datetime.datetime] | None,
          err: TextIO) -> Inventory | None:
    """The node's inventory, or None after printing why NVML cannot be used."""
    try:
        return read_inventory(backend, node=node, now=now)
    except NvmlUnavailable as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return None


def _once(args: argparse.Namespace, backend: NvmlBackend, node: str, annotate: Annotate | None,
          now: Callable[[], datetime.datetime] | None, out: TextIO, err: TextIO) -> int:
    inventory = _read(backend, node, now, err)
    if inventory is None:
        return EXIT_NO_NVML
    if args.output == "table":
        render_table(inventory, out)
    else:
        write(inventory.to_dict(), args.output, out)
    if annotate is None:
        return EXIT_OK
    try:
        value = summarize(inventory).to_json()
        annotate(args.annotate_node, {ANNOTATION: value})
    except AnnotateError as exc:
        print(f"{PROG}: error: cannot annotate {exc}", file=err)
        return EXIT_FAILED
    print(f"{PROG}: annotated node {args.annotate_node}: {ANNOTATION} "
          f"({len(inventory.gpus)} GPUs, {len(value)} bytes)", file=err)
    return EXIT_OK


def _round(args: argparse.Namespace, backend: NvmlBackend, node: str, annotate: Annotate | None,
           now: Callable[[], datetime.datetime] | None, out: TextIO, err: TextIO) -> int:
    """One round of the loop: read, annotate (or print the JSON), log one line."""
    inventory = _read(backend, node, now, err)
    if inventory is None:
        return EXIT_NO_NVML
    if annotate is None:
        out.write(json.dumps(inventory.to_dict(), separators=(",", ":")) + "\n")
        out.flush()
        return EXIT_OK
    value = summarize(inventory).to_json()
    try:
        annotate(args.annotate_node, {ANNOTATION: value})
    except AnnotateError as exc:
        print(f"{inventory.collected_at} {PROG}: error: cannot annotate {exc} (retrying in "
              f"{args.interval:g}s)", file=err)
        err.flush()
        return EXIT_FAILED
    lost = sum(1 for g in inventory.gpus if g.status != "ok")
    print(f"{inventory.collected_at} annotated node {args.annotate_node}: "
          f"{len(inventory.gpus)} GPUs ({lost} not ok), {len(value)} bytes", file=out)
    out.flush()
    return EXIT_OK


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 10 <= value <= 86400:
        raise argparse.ArgumentTypeError("expected 10 to 86400 seconds")
    return value


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard inventory``; returns (name, handler)."""
    parser = commands.add_parser(
        "inventory", help="read this machine's GPUs through NVML (devices, MIG, processes)",
        description="Read the GPUs of this machine through NVML: index, UUID, name, memory, "
        "utilization, MIG mode and MIG devices with their profiles, compute processes, driver "
        "and CUDA versions. NVML errors per GPU are recorded, not fatal. With --annotate-node, "
        f"write a compact summary to the Node as the {ANNOTATION} annotation (what "
        "'gpuguard audit --inventory' joins with the allocations). Schema: docs/inventory.md. "
        "Exit codes: 0 done, 2 usage or annotation failure, 3 NVML not available.",
    )
    parser.add_argument("-o", "--output", choices=("json", "yaml", "table"), default="json",
                        help="json (the GPUInventory document, default), yaml (the same "
                        "document) or table")
    parser.add_argument("--annotate-node", metavar="NAME",
                        help=f"patch the {ANNOTATION} annotation of Node NAME (needs patch on "
                        "nodes)")
    parser.add_argument("--node", metavar="NAME",
                        help="node name recorded in the inventory (default: --annotate-node, "
                        "$NODE_NAME, else the host name)")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig for --annotate-node (default: the pod's service "
                        "account, $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--interval", type=_interval, metavar="SECONDS",
                        help="repeat every SECONDS (10-86400) until stopped, logging one line "
                        "per round (with --annotate-node; else one compact JSON per line)")
    return "inventory", lambda args, settings: run(args)
