"""Namespace context for admission: the labels file (standalone) and the watch cache, the latter
against a fake Kubernetes API server on loopback driven through the official client (paginated
list, watch events, BOOKMARK, 410 Gone -> relist), and the cluster configuration detection.

No assertion depends on timing: the tests wait, with a generous bound, for the cache to apply a
resourceVersion (:meth:`NamespaceWatch.wait_for`) or for the fake to receive a request.
"""

import asyncio
import json

import pytest
from aiohttp import web
from kubernetes import client as k8s_client

from kube.config import ClusterConfigError, detect
from kube.namespaces import (
    NamespaceFileError,
    NamespaceWatch,
    StaticNamespaces,
    read_namespace_file,
)
from policies.facts.review import NAMESPACE_NAME_LABEL as NAME_LABEL
from policies.facts.review import namespace_stub
from tests.fakes.webhook_harness import JSON, Harness, bug_review, gpu_policy, write_policies
from tests.paths import ROOT, TESTS

WAIT_S = 60.0  # upper bound of every wait; never an assertion about speed


async def within(awaitable, what):
    """Await ``awaitable``; fail after WAIT_S (the condition was never reached)."""
    try:
        async with asyncio.timeout(WAIT_S):
            return await awaitable
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


# --- the standalone labels file --------------------------------------------------------------


def test_labels_file_as_a_name_to_labels_map(tmp_path):
    path = tmp_path / "ns.yaml"
    path.write_text("team-a: {gpuguard.io/team: a, tier: 1}\nkube-system:\nflags: {enabled: true}\n")
    namespaces = read_namespace_file(str(path))
    assert namespaces["team-a"] == namespace_stub("team-a", {"gpuguard.io/team": "a",
                                                            "tier": "1"})
    assert namespaces["kube-system"]["metadata"]["labels"] == {NAME_LABEL: "kube-system"}
    assert namespaces["flags"]["metadata"]["labels"]["enabled"] == "true"


def test_labels_file_as_kubectl_get_ns_output():
    namespaces = read_namespace_file(str(ROOT / "examples" / "cluster" / "namespaces.yaml"))
    assert {"team-llm", "team-vision", "team-research", "gpu-operator"} <= set(namespaces)
    assert namespaces["team-llm"]["metadata"]["labels"] == {"gpuguard.io/team": "llm",
                                                            NAME_LABEL: "team-llm"}


def test_labels_file_as_namespace_documents(tmp_path):
    path = tmp_path / "ns.yaml"
    path.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  labels: {x: y}\n"
                    "  managedFields: [{manager: kubectl}]\n---\napiVersion: v1\nkind: Namespace"
                    "\nmetadata: {name: b}\n")
    namespaces = read_namespace_file(str(path))
    assert namespaces["a"]["metadata"] == {"name": "a", "labels": {"x": "y", NAME_LABEL: "a"}}
    assert namespaces["b"]["metadata"]["labels"] == {NAME_LABEL: "b"}


@pytest.mark.parametrize(("text", "message"), [
    ("team-a: [1, 2]\n", "ns.yaml: document 0: team-a: expected a map of label names to values"),
    ("team-a: {x: {y: z}}\n", "ns.yaml: document 0: team-a.x: expected a label value"),
    ("- a\n- b\n", "ns.yaml: document 0: expected a map of namespace names to labels"),
    ("apiVersion: v1\nkind: List\nitems:\n- kind: Pod\n", "document 0: items[0]: expected a "
     "Namespace"),
    ("apiVersion: v1\nkind: List\nitems:\n- kind: Namespace\n  metadata: {}\n",
     "document 0: items[0]: metadata.name: expected a name"),
    ("a: [\n", "ns.yaml: document 0: invalid YAML at line 2: while parsing a flow node"),
    # The one YAML reader of the project: an alias bomb is refused, not expanded.
    ((TESTS / "data" / "edge" / "alias-bomb.yaml").read_text(),
     "refused as a YAML alias bomb"),
])
def test_labels_file_errors_name_the_entry(tmp_path, text, message):
    path = tmp_path / "ns.yaml"
    path.write_text(text)
    with pytest.raises(NamespaceFileError) as error:
        read_namespace_file(str(path))
    assert message in str(error.value)


def test_missing_labels_file(tmp_path):
    with pytest.raises(NamespaceFileError, match="cannot be read"):
        read_namespace_file(str(tmp_path / "nope.yaml"))


def test_static_source_gives_stubs_for_unknown_namespaces():
    source = StaticNamespaces({}, "none")
    assert source.get("default") == namespace_stub("default")
    assert source.status() == (True, "0 namespaces from none")


# --- cluster configuration -------------------------------------------------------------------


def kubeconfig(path, server):
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {"token": "abc"}}]}))
    return path


def test_no_cluster_configured_means_standalone(tmp_path):
    environ = {"KUBECONFIG": str(tmp_path / "missing")}
    assert detect(environ=environ, token_file=str(tmp_path / "no-token")) is None


def test_kubeconfig_from_the_environment_and_explicit(tmp_path):
    path = kubeconfig(tmp_path / "config", "http://127.0.0.1:1")
    found = detect(environ={"KUBECONFIG": str(path)}, token_file=str(tmp_path / "none"))
    assert found.source == f"kubeconfig {path}"
    assert found.api_client.configuration.host == "http://127.0.0.1:1"
    assert detect(str(path), environ={}).source == f"kubeconfig {path}"


def test_unusable_cluster_configuration_is_an_error(tmp_path):
    with pytest.raises(ClusterConfigError, match="no such file"):
        detect(str(tmp_path / "missing"), environ={})
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nope\n")
    with pytest.raises(ClusterConfigError, match="cluster configuration cannot be used"):
        detect(environ={"KUBECONFIG": str(broken)}, token_file=str(tmp_path / "none"))


# --- the watch cache against a fake API server -----------------------------------------------


def namespace(name, version, labels=None):
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "resourceVersion": str(version),
                         "labels": {NAME_LABEL: name, **(labels or {})},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


class FakeAPI:
    """Serves /api/v1/namespaces: lists (paginated) and scripted watches.

    ``requests`` holds the query of each request; ``watching`` is set when the live watch (the
    one after the scripted ones, fed from ``live``) has begun.
    """

    def __init__(self):
        self.lists = [
            # first list, in two pages
            [{"items": [namespace("team-a", 10, {"gpuguard.io/team": "a"})],
              "metadata": {"continue": "page2", "resourceVersion": "100"}},
             {"items": [namespace("team-b", 11)], "metadata": {"resourceVersion": "100"}}],
            # relist after 410 Gone: team-b was deleted while the watch was gone
            [{"items": [namespace("team-a", 10, {"gpuguard.io/team": "a"}),
                        namespace("team-d", 150)], "metadata": {"resourceVersion": "200"}}],
        ]
        self.watches = [
            [{"type": "ADDED", "object": namespace("team-c", 101)},
             {"type": "MODIFIED", "object": namespace("team-a", 102, {"gpuguard.io/team": "a",
                                                                     "tier": "gold"})},
             {"type": "BOOKMARK", "object": {"kind": "Namespace",
                                             "metadata": {"resourceVersion": "103"}}},
             {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                          "message": "too old resource version: 103"}}],
        ]
        self.live = asyncio.Queue()
        self.requests = []
        self.watching = asyncio.Event()

    async def handle(self, request):
        query = dict(request.query)
        self.requests.append(query)
        if query.get("watch") in ("true", "True", "1"):
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            script = self.watches.pop(0) if self.watches else None
            if script is not None:
                for event in script:
                    await response.write(json.dumps(event).encode() + b"\n")
                return response
            self.watching.set()
            while True:  # the live watch: events pushed by the test, None ends it
                event = await self.live.get()
                if event is None:
                    return response
                await response.write(json.dumps(event).encode() + b"\n")
        pages = self.lists[0]
        page = pages[1] if query.get("continue") == "page2" else pages[0]
        if page is pages[-1]:
            self.lists.pop(0)
        return web.json_response({"apiVersion": "v1", "kind": "NamespaceList", **page})


@pytest.mark.asyncio
async def test_watch_cache_lists_watches_and_relists_after_410(aiohttp_server, tmp_path):
    fake = FakeAPI()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces", fake.handle)
    server = await aiohttp_server(app)
    configuration = k8s_client.Configuration(host=f"http://127.0.0.1:{server.port}")
    watch = NamespaceWatch(k8s_client.ApiClient(configuration), watch_timeout_s=60)
    assert watch.status()[0] is False
    watch.start(asyncio.get_running_loop())
    try:
        await within(watch.wait_for(lambda: watch.resource_version == "200"), "the relist")
        await within(fake.watching.wait(), "the watch from the relist's resourceVersion")
        assert watch.lists == 2
        synced, detail = watch.status()
        assert synced and detail == "2 namespaces, watching"
        # The relist replaced the cache: team-b (deleted meanwhile) is gone, team-c too.
        assert set(watch._namespaces) == {"team-a", "team-d"}
        team_a = watch.get("team-a")
        assert "managedFields" not in team_a["metadata"]
        assert team_a["status"] == {"phase": "Active"}
        assert watch.get("unknown") == namespace_stub("unknown")
        # Requests: 2 list pages, a watch from 100, a relist, a watch from 200.
        lists = [q for q in fake.requests if "watch" not in q]
        watches = [q for q in fake.requests if "watch" in q]
        assert [q.get("continue") for q in lists] == [None, "page2", None]
        assert [q["resourceVersion"] for q in watches] == ["100", "200"]
        assert all(q["allowWatchBookmarks"] in ("true", "True") for q in watches)
        # Live events are applied on the loop.
        await fake.live.put({"type": "MODIFIED", "object": namespace("team-d", 201, {"x": "y"})})
        await fake.live.put({"type": "DELETED", "object": namespace("team-a", 202)})
        await within(watch.wait_for(lambda: watch.resource_version == "202"),
                     "the DELETED event")
        assert "team-a" not in watch._namespaces
        assert watch.get("team-d")["metadata"]["labels"] == {NAME_LABEL: "team-d", "x": "y"}
    finally:
        await asyncio.to_thread(watch.stop)
        await fake.live.put(None)


@pytest.mark.asyncio
async def test_watched_labels_drive_namespace_selectors(aiohttp_server, aiohttp_client, tmp_path):
    fake = FakeAPI()
    fake.lists = [[{"items": [namespace("team-a", 10, {"gpuguard.io/team": "a"})],
                    "metadata": {"resourceVersion": "100"}}]]
    fake.watches = []
    app = web.Application()
    app.router.add_get("/api/v1/namespaces", fake.handle)
    server = await aiohttp_server(app)
    watch = NamespaceWatch(k8s_client.ApiClient(
        k8s_client.Configuration(host=f"http://127.0.0.1:{server.port}")))
    watch.start(asyncio.get_running_loop())
    policy = gpu_policy("team-a-no-gpus", {
        "match": {"namespaceSelector": {"matchLabels": {"gpuguard.io/team": "a"}}},
        "matchConditions": [{"name": "gpu", "expression": "gpu.requested"}],
        "validations": [{"expression": "false", "message": "team a has no GPUs"}]})
    harness = Harness([write_policies(tmp_path, policy)], namespaces=watch)
    client = await aiohttp_client(harness.app)
    try:
        await within(watch.wait_for(lambda: watch.status()[0]), "the first list")
        assert watch.resource_version == "100"
        assert (await client.get("/readyz")).status == 200
        review = bug_review("kyverno-kyverno-532.yaml")  # a GPU pod in team-a
        response = await client.post("/validate", data=json.dumps(review), headers=JSON)
        assert (await response.json())["response"]["allowed"] is False
        await fake.live.put({"type": "MODIFIED", "object": namespace("team-a", 101)})
        await within(watch.wait_for(lambda: watch.resource_version == "101"),
                     "the label removal")
        assert "gpuguard.io/team" not in watch.get("team-a")["metadata"]["labels"]
        response = await client.post("/validate", data=json.dumps(review), headers=JSON)
        assert (await response.json())["response"]["allowed"] is True
    finally:
        await asyncio.to_thread(watch.stop)
        await fake.live.put(None)
        harness.close()


@pytest.mark.asyncio
async def test_unreachable_api_is_not_ready_and_retried(closed_port):
    watch = NamespaceWatch(k8s_client.ApiClient(
        k8s_client.Configuration(host=f"http://127.0.0.1:{closed_port}")), max_backoff_s=0.05)
    watch.start(asyncio.get_running_loop())
    try:
        await within(watch.wait_for(lambda: "listing" not in watch.status()[1]),
                     "the first failure")
        synced, detail = watch.status()
        assert synced is False and detail.startswith("namespace list not received yet: ")
    finally:
        await asyncio.to_thread(watch.stop)
