"""Compliance auditor: what already runs, judged by the admission policies, and how well the GPUs
are placed.

Owns, module by module:

- sources: :mod:`audit.file_source` (snapshot files, streamed item by item when large) and
  :mod:`audit.cluster_source` (a live cluster through :mod:`kube.lists`, read-only);
- the scan (:mod:`audit.scanner`): one pass over the objects, feeding
  :mod:`audit.ownership` (pods rolled up to their workload), :mod:`audit.pods` (what one pod
  takes), :mod:`audit.node_capacity` (what one node offers, per resource and in
  GPU-equivalents), :mod:`audit.placement` (allocation, free, fragmented, stranded, MIG and pending
  GPUs, with :mod:`audit.scheduling` for the scheduler's filters) and :mod:`audit.compliance` (the
  policy set at the audit point, once per workload, as findings with a severity), handing what
  it found over as one typed :class:`audit.scan_result.ScanResult`;
- :mod:`audit.utilization`: DCGM exporter metrics and allocated-but-idle GPUs;
- :mod:`audit.report`: the report of a scan result (a JSON-ready dict, documented in
  ``docs/audit-report.md``; it never imports the scanner), and
  its renderers :mod:`audit.render_terminal`, :mod:`audit.render_markdown`,
  :mod:`audit.render_html` (with :mod:`audit.svg_charts`; the three share
  :mod:`audit.report_tables`) and :mod:`audit.policy_reports` (``wgpolicyk8s.io/v1alpha2``);
- :mod:`audit.history`: runs in SQLite and what changed since the previous one;
- :mod:`audit.settings`: the frozen settings built by the CLI;
- the NVML inventory (``docs/inventory.md``): :mod:`audit.nvml` (the only ``pynvml`` importer:
  backend protocol and loader), :mod:`audit.nvml_reader` (reading a machine's GPUs),
  :mod:`audit.inventory` and :mod:`audit.inventory_summary` (the documents),
  :mod:`audit.inventory_files` (``--inventory`` inputs), :mod:`audit.inventory_join` (findings
  against the allocations) and :mod:`audit.inventory_audit` (their place in the scan).

Must not serve HTTP admission, import :mod:`webhook` or :mod:`certs`, or write to the cluster
itself (:mod:`kube.policy_reports` does, when asked; :mod:`kube.node_annotations` writes the
inventory annotation for ``gpuguard inventory``).
"""
