"""``gpuguard match-conditions``: write the webhooks' matchConditions from the GPU registries.

Reads Validating- / MutatingWebhookConfigurations (``deploy/base/webhooks.yaml``), and for each
webhook writes the ``matchConditions`` of :mod:`policies.facts.prefilter` for the resources its
rules match, as a kustomize strategic-merge patch (``deploy/base/match-conditions.yaml``, applied by
``deploy/base/kustomization.yaml``). ``--check`` compares instead of writing. Exit codes: 0 written
or up to date, 1 ``--check`` found the file out of date, 2 bad input or usage (the message names
the file, webhook and rule).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuguard.settings import add_gpu_settings
from policies.facts import prefilter
from policies.facts.resource_names import GPUSettings
from policies.sources import printable, read_documents

EXIT_OK, EXIT_STALE, EXIT_USAGE = 0, 1, 2
_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
_API_VERSION = "admissionregistration.k8s.io/v1"


class InputError(ValueError):
    """A webhook configuration the conditions cannot be generated for (names where and why)."""


def _rule_resources(where: str, rules: Any) -> list[tuple[str, str]]:
    """``(apiGroup, resource)`` of every rule; wildcards and odd shapes are refused."""
    if not isinstance(rules, list) or not rules:
        raise InputError(f"{where}.rules: expected a non-empty list of rules")
    found: list[tuple[str, str]] = []
    for index, rule in enumerate(rules):
        at = f"{where}.rules[{index}]"
        groups = rule.get("apiGroups") if isinstance(rule, dict) else None
        resources = rule.get("resources") if isinstance(rule, dict) else None
        if not isinstance(groups, list) or not isinstance(resources, list):
            raise InputError(f"{at}: expected apiGroups and resources lists")
        for group in groups:
            for resource in resources:
                if not isinstance(group, str) or not isinstance(resource, str):
                    raise InputError(f"{at}: apiGroups and resources must be strings")
                if "*" in group or "*" in resource:
                    raise InputError(f"{at}: {group or 'core'}/{resource}: a wildcard matches "
                                     "kinds whose pod templates gpuguard cannot know; list the "
                                     "resources")
                found.append((group, resource))
    return found


def patch_documents(configurations: Sequence[dict[str, Any]], sources: Sequence[str],
                    settings: GPUSettings) -> list[dict[str, Any]]:
    """One patch document per configuration: ``webhooks[].{name, matchConditions}``.

    ``sources`` names each configuration's origin for messages. Raises :class:`InputError`.
    """
    patches = []
    for config, source in zip(configurations, sources, strict=True):
        name = (config.get("metadata") or {}).get("name")
        webhooks = config.get("webhooks")
        where = f"{source}: {config.get('kind')} {name}"
        if not isinstance(name, str) or not isinstance(webhooks, list) or not webhooks:
            raise InputError(f"{where}: expected metadata.name and a non-empty webhooks list")
        entries = []
        for index, webhook in enumerate(webhooks):
            hook = webhook.get("name") if isinstance(webhook, dict) else None
            at = f"{where}: webhooks[{index}] ({hook})"
            if not isinstance(hook, str):
                raise InputError(f"{at}: expected a webhook with a name")
            resources = _rule_resources(at, webhook.get("rules"))
            try:
                conditions = prefilter.match_conditions(resources, settings)
            except ValueError as exc:
                raise InputError(f"{at}: {exc}") from None
            entries.append({"name": hook, "matchConditions": [c.to_dict() for c in conditions]})
        patches.append({"apiVersion": _API_VERSION, "kind": config["kind"],
                        "metadata": {"name": name}, "webhooks": entries})
    return patches


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings, so the CEL reads as written."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def render(patches: Sequence[dict[str, Any]], command: str) -> str:
    """The patch file: a header naming ``command``, then the documents."""
    header = "".join(f"# {line}\n" for line in (
        "GENERATED: do not edit. Regenerate with",
        f"  {command}",
        "(with --check it fails while this file differs from what it writes).",
        "The webhooks' matchConditions (policies/facts/prefilter.py), from the same registries as",
        "the GPU facts: the API server calls gpuguard only for objects that can touch a GPU, so an",
        'outage of gpuguard blocks nothing else (deploy/README.md, "When the webhook is down").',
        "Regenerate after changing the webhook rules, the GPU resource names or gpuguard serve's",
        "--gpu-resource flags (pass the same flags here).",
    ))
    body = yaml.dump_all(patches, Dumper=_Dumper, sort_keys=False, width=100,
                         explicit_start=False)
    return header + body.replace("\n...\n", "\n")


def run(paths: Sequence[str], output: str | None, check: bool, settings: GPUSettings,
        command: str) -> int:
    """Generate the patch for the configurations in ``paths``; see the module docstring."""
    documents, errors = read_documents(paths)
    for error in errors:
        print(f"gpuguard match-conditions: {error}", file=sys.stderr)
    configurations = [d for d in documents if d.body.get("kind") in _KINDS]
    if errors:
        return EXIT_USAGE
    if not configurations:
        print(f"gpuguard match-conditions: {', '.join(map(printable, paths))}: no "
              "ValidatingWebhookConfiguration or MutatingWebhookConfiguration", file=sys.stderr)
        return EXIT_USAGE
    try:
        text = render(patch_documents([d.body for d in configurations],
                                      [d.source for d in configurations], settings), command)
    except InputError as exc:
        print(f"gpuguard match-conditions: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    if output is None:
        sys.stdout.write(text)
        return EXIT_OK
    target = Path(output)
    if check:
        try:
            current = target.read_text(encoding="utf-8")
        except OSError as exc:
            print(f"gpuguard match-conditions: {printable(output)}: cannot read: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
        if current != text:
            print(f"gpuguard match-conditions: {printable(output)} is out of date: run "
                  f"`{command}`", file=sys.stderr)
            return EXIT_STALE
        return EXIT_OK
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"gpuguard match-conditions: {printable(output)}: cannot write: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _command_line(args: argparse.Namespace) -> str:
    """The command that regenerates the same output (``--check`` left out)."""
    parts = ["gpuguard match-conditions"]
    parts += [f"--gpu-resource {name}" for name in args.gpu_resource]
    parts += [f"--shared-replicas {item}" for item in args.shared_replicas]
    parts += list(args.paths)
    if args.output:
        parts.append(f"-o {args.output}")
    return " ".join(parts)


def register(commands: Any) -> tuple[str, Callable[[argparse.Namespace, GPUSettings], int]]:
    """Add ``gpuguard match-conditions``; returns (name, handler)."""
    parser = commands.add_parser(
        "match-conditions", help="write the webhooks' matchConditions (send only GPU objects)",
        description="For each webhook of the given Validating- / MutatingWebhookConfigurations, "
        "write the matchConditions that send the API server's requests to gpuguard only for "
        "pods and workloads that can touch a GPU, as a kustomize patch. Exit 1 with --check "
        "when the file is out of date, 2 for bad input.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="webhook configuration file (deploy/base/webhooks.yaml)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write here (default: standard output)")
    parser.add_argument("--check", action="store_true",
                        help="compare with --output instead of writing it")
    add_gpu_settings(parser)

    def handler(args: argparse.Namespace, settings: GPUSettings) -> int:
        if args.check and not args.output:
            print("gpuguard match-conditions: --check needs --output FILE", file=sys.stderr)
            return EXIT_USAGE
        return run(args.paths, args.output, args.check, settings, _command_line(args))

    return "match-conditions", handler
