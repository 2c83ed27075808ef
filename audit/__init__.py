"""Compliance auditor (to be filled by the auditor issue).

Will own object sources (snapshot files, live cluster through :mod:`kube`), the scanner, GPU
placement efficiency (allocation, fragmentation, MIG waste, idle GPUs), the NVML inventory reader
(``pynvml`` from ``nvidia-ml-py``), report renderers and report history. Must not serve HTTP
admission.
"""
