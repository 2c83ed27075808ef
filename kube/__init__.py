"""Kubernetes API access: the only importer of the official ``kubernetes`` client.

Owns configuration (in-cluster service account or kubeconfig), paginated lists, the watch caches
the webhook keeps (namespaces, pod usage for quota), the quota ledger, writing PolicyReports, Node
annotations and webhook caBundles. Must not know about HTTP serving or policy semantics.
"""
