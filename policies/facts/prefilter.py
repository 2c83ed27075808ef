"""Which admission requests reach gpuguard at all: the webhooks' ``matchConditions``, generated.

Owns the CEL text that kube-apiserver evaluates before it calls gpuguard, so that an outage of
gpuguard blocks only what can touch a GPU (HAMi#160 and kueue#5244 are clusters stopped by GPU
webhooks that saw every pod). A pod or pod template is sent when it has any of:

- a container (init, app or ephemeral) asking for a resource that
  :func:`policies.facts.resource_names.classify` does not call ``OTHER`` (:func:`~policies.
  resource_names.name_patterns`: exact names, prefixes, the accelerator hint);
- DRA ``spec.resourceClaims``;
- an env var the GPU runtimes read to expose devices (``policies.facts.gpu``'s device env list),
  or an ``envFrom`` whose prefix (such as ``NVIDIA_``) begins one — one without a prefix is
  not sent: the library does not deny it by default (no-unrequested-gpu-access's
  ``includeUncertain``), and every app that uses envFrom would otherwise depend on gpuguard;
- a ``hostPath`` volume on ``/dev``, a GPU device path (``policies.facts.gpu``'s device paths) or
  ``/``, or with a ``.`` / ``..`` element (the facts clean the path; CEL cannot, so it sends it);
- a privileged container, or one that adds ``SYS_ADMIN`` or ``ALL`` (the NVIDIA toolkit's
  "privileged");
- a KAI / Run:ai (``policies.facts.gpu.KAI_*``) or HAMi placement annotation;

a KubeVirt VM when its domain lists ``gpus`` or ``hostDevices``, and an operator's own
accelerator field when present and not empty (:data:`ACCELERATOR_FIELD_LOCATIONS`: the NIM
operator's ``draResources``, KAITO's ``resource.mig``). Workload kinds are searched
at the locations of the one workload registry (:mod:`policies.facts.workload_kinds`): pod
templates (:data:`TEMPLATE_LOCATIONS`), bare PodSpecs (:data:`POD_SPEC_LOCATIONS`: the tests
above but annotations, which a PodSpec has none of) and resource blocks
(:data:`RESOURCE_LOCATIONS`: ``limits`` / ``requests`` or a bare ResourceList naming a GPU
resource), as :mod:`policies.facts.workloads` reads them. The test is a superset of what the
GPU facts count (it looks at names, not values: ``nvidia.com/gpu: 0`` or
``NVIDIA_VISIBLE_DEVICES=void`` are sent too), so
nothing a policy could deny is skipped; ``tests/core/test_prefilter.py`` checks both against the
facts.

The expressions use only what the API server's CEL environment for webhook matchConditions has on
Kubernetes 1.30 (optional types, ``matches``, the standard macros; no ``cel.bind``) and what
:mod:`policies.cel.runtime` runs. Objects are read as the API server decodes them: a null where a
map or list belongs (only in an invalid object, or in a CRD subtree without a schema) makes the
evaluation fail, which the Ignore webhooks treat as "skip"; Pods reach the validating webhook only
after the API server validated them.

Must not evaluate CEL, read files or know the deploy manifests' layout: it only writes text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from policies.facts.dra import MIG_DEVICE_CLASSES

# The device env vars, device paths and container types are policies.facts.gpu's own tables,
# imported so that the conditions follow them (it has no public names for them yet).
from policies.facts.gpu import (
    _ALL_CAPABILITIES,
    _CONTAINER_TYPES,
    _DEVICE_ENV,
    _DEVICE_PATHS,
    _PRIVILEGED_CAPABILITIES,
    KAI_CONTAINER,
    KAI_DEVICES,
    KAI_FRACTION,
    KAI_MEMORY,
)
from policies.facts.resource_names import (
    DEFAULT_SETTINGS,
    GPU_DEVICE_CLASS_HINTS,
    NON_GPU_DEVICE_CLASSES,
    GPUSettings,
    name_patterns,
)
from policies.facts.workload_kinds import EPHEMERAL_CONTAINERS, WORKLOAD_KINDS

# HAMi's pod annotations that pick or steer GPUs (gpu-domain.md, "HAMi pod annotations"). The GPU
# facts do not count them (they only matter next to a GPU resource); sending them costs nothing.
HAMI_ANNOTATIONS: Final = (
    "nvidia.com/use-gputype", "nvidia.com/nouse-gputype", "nvidia.com/use-gpuuuid",
    "nvidia.com/nouse-gpuuuid", "nvidia.com/vgpu-mode", "nvidia.com/numa-bind",
    "hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy",
)
GPU_ANNOTATIONS: Final = (KAI_FRACTION, KAI_MEMORY, KAI_DEVICES, KAI_CONTAINER, *HAMI_ANNOTATIONS)
"""Pod (template) annotations that make gpuguard look at an object."""

CONTAINER_FIELDS: Final = _CONTAINER_TYPES
"""The container lists of a PodSpec the GPU facts read (init, app, ephemeral)."""

# Where each webhook-matched resource keeps its pod templates, and where KubeVirt lists a domain's
# devices (policies.facts.gpu.virtual_machine_facts), from the one workload registry.
TEMPLATE_LOCATIONS: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    **{(k.group, k.plural): k.templates for k in WORKLOAD_KINDS},
    ("", EPHEMERAL_CONTAINERS): ("",),  # the object is the whole Pod
}
POD_SPEC_LOCATIONS: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    (k.group, k.plural): k.pod_specs for k in WORKLOAD_KINDS if k.pod_specs
}
RESOURCE_LOCATIONS: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    (k.group, k.plural): k.resources for k in WORKLOAD_KINDS if k.resources
}
DEVICE_LOCATIONS: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    (k.group, k.plural): k.devices for k in WORKLOAD_KINDS if k.devices
}
# Operator fields that ask for accelerators by themselves (NIM draResources, KAITO resource.mig):
# sent when present and not empty, whatever they name (the facts resolve them).
ACCELERATOR_FIELD_LOCATIONS: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    (k.group, k.plural): (*k.claim_refs, *k.mig_requests) for k in WORKLOAD_KINDS
    if k.claim_refs or k.mig_requests
}

# Where a resource.k8s.io ResourceClaim / ResourceClaimTemplate keeps its ResourceClaimSpec
# (policies.facts.dra.claim_devices): judged themselves, as a pod arrives without its claims.
CLAIM_LOCATIONS: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    ("resource.k8s.io", "resourceclaims"): ("spec",),
    ("resource.k8s.io", "resourceclaimtemplates"): ("spec.spec",),
}
# A selector the facts read as MIG slices (policies.facts.dra: ``type == 'mig'`` or any test
# of a ``profile`` attribute), as RE2.
_MIG_SELECTOR = r"\.profile\b|\[['\"]profile['\"]\]|\.type\s*==\s*['\"]mig['\"]"

NOT_BEING_DELETED: Final = "not-an-update-of-an-object-being-deleted"
CAN_TOUCH_GPUS: Final = "can-touch-gpus"
# An UPDATE of an object that already has a deletionTimestamp (a controller removing its
# finalizer, a label change) can give no new GPU access: a Pod being deleted is never scheduled
# again. Skipping these keeps an outage from leaving GPU pods stuck Terminating. Subresources
# (pods/ephemeralcontainers: `kubectl debug` of a running pod) are still sent.
_NOT_BEING_DELETED_CEL: Final = (
    "request.operation != 'UPDATE' || request.?subResource.orValue('') != '' ||\n"
    "object == null || !object.?metadata.?deletionTimestamp.hasValue()"
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class MatchCondition:
    """One entry of a webhook's ``matchConditions``: a qualified ``name`` and a bool CEL
    ``expression`` over ``object``, ``oldObject`` and ``request``."""

    name: str
    expression: str

    def to_dict(self) -> dict[str, str]:
        """The API form ``{name, expression}``."""
        return {"name": self.name, "expression": self.expression}


def _quote(text: str) -> str:
    """A CEL single-quoted string literal (backslash and quote escaped)."""
    if any(ord(ch) < 0x20 for ch in text):
        raise ValueError(f"{text!r}: control characters do not belong in a generated condition")
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


def _regex_words(words: Iterable[str]) -> str:
    """An RE2 alternation of literal words."""
    return "|".join(re.escape(w) for w in words)


def _chain(var: str, fields: list[str]) -> str:
    """``var.?a.?b`` (an optional): present when every field on the way is."""
    for name in fields:
        if not _IDENTIFIER.fullmatch(name):
            raise ValueError(f"{name!r}: not a field name a generated condition can select")
    return var + "".join(f".?{name}" for name in fields)


def gpu_resource_test(var: str, settings: GPUSettings = DEFAULT_SETTINGS) -> str:
    """CEL that is true when the resource name in ``var`` is a GPU (or GPU-like) resource.

    Exactly :func:`policies.facts.resource_names.classify` ``is not OTHER`` for ``settings``: the
    registry's exact names (those the hint does not already catch), its prefixes, and its
    accelerator hint searched in a name with a ``/``, case-insensitively.

    Written for the API server's cost, which it spends on every key of every ``limits`` and
    ``requests`` (a CPU pod's keys are all tested and all false, so each test is paid in full):
    cel-go charges a ``matches`` the product of the name's and the pattern's lengths, a
    ``startsWith`` the prefix's length. So a name without ``/`` (``cpu``, ``hugepages-2Mi``)
    stops at the first test; a prefix that is a whole domain (``huawei.com/``) is one lookup of
    the name's domain in a list; the longer prefixes are tested only under their domain
    (``nvidia.com/GRID_`` after ``nvidia.com/``); and the hint is one short case-insensitive
    search (given a ``/``, a word of the hint lies before or after one). About 45 cost units a
    key (it was 185 with one ``startsWith`` a prefix and a hint pattern twice as long), measured
    with cel-go in ``tests/controlplane/test_match_conditions_live.py``.
    """
    patterns = name_patterns(settings)
    hint = re.compile(patterns.hint, re.IGNORECASE)
    names = [n for n in patterns.names if "/" not in n or not hint.search(n)]
    if any("/" not in n for n in (*names, *patterns.prefixes)):
        raise ValueError("a GPU resource name or prefix without '/': the generated test assumes "
                         "every one has a domain")
    domains = [p for p in patterns.prefixes if p.index("/") == len(p) - 1]
    by_domain: dict[str, list[str]] = {}
    for prefix in patterns.prefixes:
        if prefix not in domains:
            by_domain.setdefault(prefix[:prefix.index("/") + 1], []).append(prefix)
    parts = [f"{var} in {_list(names)}"] if names else []
    if domains:
        parts.append(f"{var}.substring(0, {var}.indexOf('/') + 1) in {_list(domains)}")
    for domain, prefixes in by_domain.items():
        if domain in domains:
            continue  # the whole domain is already sent
        tests = " || ".join(f"{var}.startsWith({_quote(p)})" for p in prefixes)
        parts.append(f"({var}.startsWith({_quote(domain)}) && ({tests}))")
    parts.append(f"{var}.matches({_quote('(?i)' + patterns.hint)})")
    return f"{var}.contains('/') && (" + " || ".join(parts) + ")"


def device_path_regex() -> str:
    """RE2 for a hostPath that may reach GPU devices, a superset of what the facts clean and
    count (``policies.facts.gpu._host_path_exposure``): ``/`` (any number of slashes), any path
    with a ``.`` or ``..`` element, and ``/dev`` itself or a device path of
    ``policies.facts.gpu``, with any number of slashes where the facts collapse or expect one.
    Not the empty string (the value of a volume without a hostPath)."""
    names = [p.removeprefix("/dev/") for p in _DEVICE_PATHS]
    if any(p == n for p, n in zip(_DEVICE_PATHS, names, strict=True)):
        raise ValueError(f"device paths must lie under /dev/: {_DEVICE_PATHS}")
    return (r"^/+$|(?:^|/)\.\.?(?:/|$)"
            f"|^/*dev(?:/*$|/+(?:{_regex_words(names)}))")


def capability_regex() -> str:
    """RE2 for a ``capabilities.add`` entry the facts call privileged: ``ALL`` or one of
    ``policies.facts.gpu``'s privileged capabilities, any case, with or without ``CAP_``."""
    words = _regex_words(c.lower() for c in (*_PRIVILEGED_CAPABILITIES, _ALL_CAPABILITIES))
    return f"(?i)^(?:cap_)?(?:{words})$"


def container_test(var: str, settings: GPUSettings = DEFAULT_SETTINGS) -> str:
    """CEL that is true when the container in ``var`` asks for, or can reach, GPUs."""
    resources = _chain(var, ["resources"])
    security = _chain(var, ["securityContext"])
    return "\n  || ".join((
        f"{resources}.?limits.orValue({{}}).exists(r, {gpu_resource_test('r', settings)})",
        f"{resources}.?requests.orValue({{}}).exists(r, {gpu_resource_test('r', settings)})",
        f"{var}.?env.orValue([]).exists(e, e.?name.orValue('') in {_list(_DEVICE_ENV)})",
        f"{var}.?envFrom.orValue([]).exists(f, f.?prefix.orValue('') != '' && "
        f"{_list(_DEVICE_ENV)}.exists(n, n.startsWith(f.?prefix.orValue(''))))",
        f"{security}.?privileged.orValue(false) == true",
        f"{security}.?capabilities.?add.orValue([]).exists(x, "
        f"x.matches({_quote(capability_regex())}))",
    ))


def _pod_spec_tests(spec: str, settings: GPUSettings) -> tuple[str, ...]:
    """The tests of a PodSpec reached by the optional chain ``spec``: DRA claims, device
    hostPaths, then each container of each type."""
    containers = " + ".join(f"{spec}.?{f}.orValue([])" for f in CONTAINER_FIELDS)
    body = container_test("c", settings).replace("\n", "\n  ")
    return (
        f"{spec}.?resourceClaims.orValue([]).size() > 0",
        f"{spec}.?volumes.orValue([]).exists(v, "
        f"v.?hostPath.?path.orValue('').matches({_quote(device_path_regex())}))",
        f"({containers}).exists(c,\n    {body})",
    )


def pod_template_test(var: str, settings: GPUSettings = DEFAULT_SETTINGS) -> str:
    """CEL that is true when the Pod or pod template (``{metadata, spec}``) in ``var`` can touch
    GPUs: its annotations, DRA claims, device hostPaths, then each container of each type."""
    return "\n|| ".join((
        f"{_chain(var, ['metadata', 'annotations'])}.orValue({{}}).exists(a, "
        f"a in {_list(GPU_ANNOTATIONS)})",
        *_pod_spec_tests(_chain(var, ["spec"]), settings),
    ))


def pod_spec_test(var: str, settings: GPUSettings = DEFAULT_SETTINGS) -> str:
    """CEL that is true when the bare PodSpec in ``var`` (a KServe component) can touch GPUs:
    :func:`pod_template_test` without the annotations."""
    return "\n|| ".join(_pod_spec_tests(var, settings))


def resources_test(var: str, settings: GPUSettings = DEFAULT_SETTINGS) -> str:
    """CEL that is true when the resource block in ``var`` names a GPU resource: in its
    ``limits`` or ``requests`` (ResourceRequirements), or as a key (a bare ResourceList)."""
    test = gpu_resource_test("r", settings)
    return (f"{var}.?limits.orValue({{}}).exists(r, {test})\n"
            f"|| {var}.?requests.orValue({{}}).exists(r, {test})\n"
            f"|| {var}.exists(r, {test})")


def claim_test(var: str) -> str:
    """A claim spec ``var`` (a ResourceClaimSpec) with a request, ``exactly`` or
    ``firstAvailable`` alternative for MIG slices or GPUs as :mod:`policies.facts.dra` reads
    them without the DeviceClass (which is cluster-scoped, never in the request): a MIG class
    name (``mig.nvidia.com``), a class name the GPU registry calls a GPU
    (:func:`policies.facts.resource_names.device_class_is_gpu`), or a CEL selector testing
    ``type == 'mig'`` or a ``profile`` attribute. A class of another name whose own selectors
    pick GPUs is not seen (nor by the facts at the webhook)."""
    name = "q.?deviceClassName.orValue('')"
    gpu = " || ".join(f"{name}.contains({_quote(h)})" for h in GPU_DEVICE_CLASS_HINTS)
    return (
        f"{var}.?devices.?requests.orValue([]).exists(r,\n"
        "  ([r, ?r.?exactly] + r.?firstAvailable.orValue([])).exists(q,\n"
        f"    {name} in {_list(MIG_DEVICE_CLASSES)}\n"
        f"    || (!({name} in {_list(NON_GPU_DEVICE_CLASSES)}) && ({gpu}))\n"
        "    || q.?selectors.orValue([]).exists(s, s.?cel.?expression.orValue('').matches(\n"
        f"      {_quote(_MIG_SELECTOR)}))))"
    )


def _location_list(var: str, locations: Iterable[str]) -> str:
    """A CEL list of what lies at ``locations`` of ``var`` (absent ones dropped)."""
    singles: list[str] = []
    spreads: list[str] = []
    for location in locations:
        if location == "":
            singles.append(var)
            continue
        fields = location.split(".")
        spread = [i for i, f in enumerate(fields) if f == "*" or f.endswith("[]")]
        if not spread:
            singles.append("?" + _chain(var, fields))
            continue
        if len(spread) > 1:
            raise ValueError(f"{location!r}: at most one '[]' or '*' per location")
        at = spread[0]
        rest = fields[at + 1:]
        if fields[at] == "*":  # every value of the map at fields[:at]
            collection = _chain(var, fields[:at]) + ".orValue({})"
            item = var + "".join(f".{f}" for f in fields[:at]) + "[k]"
            name = "k"
        else:
            collection = _chain(var, [*fields[:at], fields[at][:-2]]) + ".orValue([])"
            item = name = "g"
        if not rest:
            spreads.append(f"{collection}.map({name}, {item})")
            continue
        guard = f"type({item}) == map && {_chain(item, rest)}.hasValue()"
        spreads.append(f"{collection}.map({name}, {guard}, {item}.{'.'.join(rest)})")
    parts = (["[" + ", ".join(singles) + "]"] if singles else []) + spreads
    return "\n  + ".join(parts)


def _locations(table: Mapping[tuple[str, str], tuple[str, ...]],
               resources: Iterable[tuple[str, str]]) -> list[str]:
    return list(dict.fromkeys(loc for key in resources for loc in table.get(key, ())))


def can_touch_gpus(resources: Iterable[tuple[str, str]],
                   settings: GPUSettings = DEFAULT_SETTINGS) -> str:
    """The CEL of :data:`CAN_TOUCH_GPUS` for a webhook whose rules match ``resources``.

    Args:
        resources: ``(apiGroup, resource)`` pairs of the webhook's rules (``("", "pods")``,
            ``("apps", "deployments")``, ``("", "pods/ephemeralcontainers")``).
        settings: the cluster's GPU names (``gpuguard serve``'s ``--gpu-resource``).

    Returns:
        A bool expression over ``object`` (``oldObject`` when ``object`` is null, as on DELETE).

    Raises:
        ValueError: a resource whose pod-template locations are not known (it would never match),
            or one the registry marks ``derived`` (judged through the workload it stands for).
    """
    resources = list(dict.fromkeys(resources))
    derived = [f"{k.group}/{k.plural}" for k in WORKLOAD_KINDS if k.derived
               and (k.group, k.plural) in resources]
    if derived:
        raise ValueError(f"{', '.join(derived)}: made by a scheduler for a workload that is "
                         "judged itself; a webhook rule for it would judge the job twice")
    unknown = [f"{g or 'core'}/{r}" for g, r in resources
               if (g, r) not in TEMPLATE_LOCATIONS and (g, r) not in CLAIM_LOCATIONS]
    if unknown:
        raise ValueError(f"no pod-template locations known for {', '.join(unknown)}: add them "
                         "to policies.facts.prefilter.TEMPLATE_LOCATIONS (as "
                         "policies.facts.workloads reads them)")
    templates = _locations(TEMPLATE_LOCATIONS, resources)
    pod_specs = _locations(POD_SPEC_LOCATIONS, resources)
    blocks = _locations(RESOURCE_LOCATIONS, resources)
    devices = _locations(DEVICE_LOCATIONS, resources)
    fields = _locations(ACCELERATOR_FIELD_LOCATIONS, resources)
    claims = _locations(CLAIM_LOCATIONS, resources)
    tests = []
    if templates == [""]:
        tests.append(pod_template_test("o", settings).replace("\n", "\n  "))
    elif templates:
        pod = pod_template_test("t", settings).replace("\n", "\n  ")
        tests.append(f"({_location_list('o', templates)}).exists(t,\n  {pod})"
                     .replace("\n", "\n  "))
    for locations, var, test in ((pod_specs, "p", pod_spec_test), (blocks, "b", resources_test)):
        if locations:
            body = test(var, settings).replace("\n", "\n  ")
            tests.append(f"({_location_list('o', locations)}).exists({var},\n  {body})"
                         .replace("\n", "\n  "))
    if devices:
        # Every gpus[] entry is a GPU; a hostDevices entry when the registry says so (not a NIC,
        # a USB disk, intel.com/qat), as policies.facts.gpu.virtual_machine_facts counts them.
        # An entry it would report as invalid (not a map, no string deviceName) is sent too.
        host = gpu_resource_test("h.deviceName", settings)
        tests.append(f"({_location_list('o', devices)}).exists(d, "
                     "d.?gpus.orValue([]).size() > 0 || d.?hostDevices.orValue([]).exists(h, "
                     "type(h) != map || type(h.?deviceName.orValue(null)) != string || "
                     f"{host}))")
    if fields:
        tests.append(f"({_location_list('o', fields)}).exists(f, f.size() > 0)")
    if claims:
        body = claim_test("c").replace("\n", "\n  ")
        tests.append(f"({_location_list('o', claims)}).exists(c,\n  {body})"
                     .replace("\n", "\n  "))
    body = "\n|| ".join(tests).replace("\n", "\n  ")
    return f"[object != null ? object : oldObject].exists(o, o != null && (\n  {body}\n))"


def match_conditions(resources: Iterable[tuple[str, str]],
                     settings: GPUSettings = DEFAULT_SETTINGS) -> tuple[MatchCondition, ...]:
    """The ``matchConditions`` of a webhook whose rules match ``resources`` (ANDed by the API
    server; a false one skips the call even when another failed to evaluate).

    Raises:
        ValueError: see :func:`can_touch_gpus`.
    """
    return (MatchCondition(NOT_BEING_DELETED, _NOT_BEING_DELETED_CEL),
            MatchCondition(CAN_TOUCH_GPUS, can_touch_gpus(resources, settings)))
