"""The scan: one pass over the objects, into one typed :class:`audit.scan.result.ScanResult`.

Owns rolling pods up to workloads (:mod:`~audit.scan.ownership`), what a pod takes
(:mod:`~audit.scan.pods`) and a node offers (:mod:`~audit.scan.node_capacity`), GPU placement
(:mod:`~audit.scan.placement`, with :mod:`~audit.scan.scheduling`), compliance findings
(:mod:`~audit.scan.compliance`) and DCGM utilization (:mod:`~audit.scan.utilization`), driven
by :mod:`~audit.scan.scanner`. Must not build or render reports.
"""
