"""Kubernetes API access (to be filled by the webhook and auditor issues).

Will be the only importer of the official ``kubernetes`` client: configuration (in-cluster or
kubeconfig), paginated lists, watch caches (namespaces, pod usage), writing PolicyReports and
SubjectAccessReviews. Must not know about HTTP serving or policy semantics.
"""
