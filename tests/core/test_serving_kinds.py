"""Kinds the wild corpus found ignored (issue 16): KServe, Kubeflow Trainer, DisaggregatedSet.

The corpus files are checked in tests/core/test_wild_corpus.py; these cover the shapes it has no file
for (InferenceService v1beta1 predictors, TrainJob without numNodes, an LWS role with a leader).
"""

from __future__ import annotations

from typing import Any

from policies.facts.workloads import workload_facts

_GPU = {"limits": {"nvidia.com/gpu": "1"}}


def _total(obj: dict[str, Any]) -> dict[str, Any]:
    facts = workload_facts(obj)
    assert facts is not None, obj["kind"]
    return facts.to_dict()


def test_inference_service_predictor_containers_and_model_resources() -> None:
    """A predictor is a PodSpec (``containers``) or a model block with ``resources``; pods are
    ``minReplicas`` (default 1)."""
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "llm"},
            "spec": {"predictor": {"minReplicas": 2,
                                   "containers": [{"name": "kserve-container",
                                                   "resources": _GPU}]},
                     "transformer": {"model": {"modelFormat": {"name": "x"},
                                               "resources": _GPU}}}}
    facts = _total(isvc)
    assert [(t["role"], t["replicas"]) for t in facts["templates"]] == [
        ("predictor", 2), ("transformer/model", 1)]
    assert facts["total"]["gpus"] == {"nvidia.com/gpu": 3}
    assert not facts["generic"]


def test_train_job_without_num_nodes_is_one_node() -> None:
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "t"}, "spec": {"trainer": {"resourcesPerNode": _GPU}}}
    facts = _total(job)
    assert facts["replicas"] == 1
    assert facts["total"]["gpus"] == {"nvidia.com/gpu": 1}
    assert facts["total"]["sources"][0]["path"] == \
        "spec.trainer.containers[0].resources.limits[nvidia.com/gpu]"


def test_disaggregated_set_role_with_a_leader() -> None:
    """Each role is an LWS spec: replicas x (leader + size - 1 workers)."""
    pod = {"spec": {"containers": [{"name": "c", "resources": _GPU}]}}
    obj = {"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSet",
           "metadata": {"name": "d"},
           "spec": {"roles": [{"name": "decode", "spec": {
               "replicas": 2, "leaderWorkerTemplate": {"size": 3, "leaderTemplate": pod,
                                                       "workerTemplate": pod}}}]}}
    facts = _total(obj)
    assert [(t["role"], t["replicas"]) for t in facts["templates"]] == [
        ("decode-leader", 2), ("decode-worker", 4)]
    assert facts["total"]["gpus"] == {"nvidia.com/gpu": 6}


def test_llm_inference_service_worker_pods() -> None:
    """spec.template and spec.worker are PodSpecs; workers one per replica (a lower bound)."""
    obj = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LLMInferenceService",
           "metadata": {"name": "l"},
           "spec": {"replicas": 2,
                    "template": {"containers": [{"name": "main", "resources": _GPU}]},
                    "worker": {"containers": [{"name": "main", "resources": _GPU}]}}}
    facts = _total(obj)
    assert facts["total"]["gpus"] == {"nvidia.com/gpu": 4}
