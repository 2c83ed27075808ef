"""``gpuguard check``: its arguments — what ``gpuguard check --help`` needs, and nothing heavier.

Owns the flags of ``gpuguard check``; the evaluation is :mod:`gpuguard.check_evaluation`, imported
only when the command runs (it pulls in the policy engine and the CEL runtime, a few hundred ms of
start-up that ``--help`` must not pay; ``tests/cli/test_cli_startup.py`` pins the import set).
Must not import the policy engine, the CEL runtime or the kubernetes client.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gpuguard.output_formats import add_output
from gpuguard.settings import add_gpu_settings
from policies.facts.resource_names import GPUSettings


def run(args: argparse.Namespace, settings: GPUSettings) -> int:
    """Run ``gpuguard check`` (:func:`gpuguard.check_evaluation.run`); returns the exit code."""
    from gpuguard import check_evaluation  # noqa: PLC0415 - the engine, only when it runs

    return check_evaluation.run(args, settings)


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard check``; returns (name, handler)."""
    parser = commands.add_parser(
        "check", help="evaluate policies offline on manifests or AdmissionReviews",
        description="Evaluate the policies (the built-in library unless --policies is given) on "
        "each object or AdmissionReview, as admission would: mutations, then validations. Exit 1 "
        "when a request would be denied.",
    )
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="PATH",
                        help="manifests or AdmissionReviews: file, directory or - (repeatable)")
    parser.add_argument("--policies", action="append", metavar="PATH",
                        help="policy file or directory (repeatable); default: built-in library")
    parser.add_argument("-n", "--namespace", default="default",
                        help="namespace for objects that name none (default: default)")
    parser.add_argument("--namespace-labels", metavar="K=V,...",
                        help="labels of the objects' namespace, for namespaceSelector and "
                        "namespaceObject")
    parser.add_argument("--snapshot", action="append", metavar="DIR",
                        help="cluster snapshot (kubectl get pods,namespaces -A -o yaml output: "
                        "file or directory, repeatable): check the GPUQuota documents of the "
                        "policy files against the usage of its running and pending pods")
    parser.add_argument("--user", default="", help="requesting user name (userInfo.username)")
    parser.add_argument("--group", action="append", default=[],
                        help="requesting user's group (repeatable)")
    add_output(parser, extra=("sarif", "junit"))
    add_gpu_settings(parser)
    return "check", run
