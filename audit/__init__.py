"""Compliance auditor: what already runs, judged by the admission policies, and how well the GPUs
are placed.

Owns, module by module:

- sources: :mod:`audit.sources.files` (snapshot files, streamed item by item when large) and
  :mod:`audit.sources.cluster` (a live cluster through :mod:`kube.lists`, read-only);
- the scan (:mod:`audit.scan.scanner`): one pass over the objects, feeding
  :mod:`audit.scan.ownership` (pods rolled up to their workload), :mod:`audit.scan.pods` (what one
  pod takes), :mod:`audit.scan.node_capacity` (what one node offers, per resource and in
  GPU-equivalents), :mod:`audit.scan.placement` (allocation, free, fragmented, stranded, MIG and
  pending GPUs, with :mod:`audit.scan.scheduling` for the scheduler's filters) and
  :mod:`audit.scan.compliance` (the policy set at the audit point, once per workload, as findings
  with a severity), handing what it found over as one typed :class:`audit.scan.result.ScanResult`;
- :mod:`audit.scan.utilization`: DCGM exporter metrics and allocated-but-idle GPUs;
- :mod:`audit.report.assemble`: the report of a scan result (a JSON-ready dict, documented in
  ``docs/audit-report.md``; it never imports the scanner), and
  its renderers :mod:`audit.render.terminal`, :mod:`audit.render.markdown`,
  :mod:`audit.render.html` (with :mod:`audit.render.svg_charts`; the three share
  :mod:`audit.report.tables`) and :mod:`audit.report.policy_reports` (``wgpolicyk8s.io/v1alpha2``);
- :mod:`audit.report.history`: runs in SQLite and what changed since the previous one;
- :mod:`audit.prices` (the ``--prices`` GPUPriceTable) and :mod:`audit.report.cost` (idle and
  stranded GPUs in money per hour, and GPU-hours and money over the history's runs);
- :mod:`audit.settings`: the frozen settings built by the CLI;
- the NVML inventory (``docs/inventory.md``): :mod:`audit.inventory.nvml` (the only ``pynvml``
  importer: backend protocol and loader), :mod:`audit.inventory.nvml_reader` (reading a machine's
  GPUs), :mod:`audit.inventory.model` and :mod:`audit.inventory.summary` (the documents),
  :mod:`audit.inventory.files` (``--inventory`` inputs), :mod:`audit.inventory.join` (findings
  against the allocations) and :mod:`audit.inventory.audit` (their place in the scan).

Must not serve HTTP admission, import :mod:`webhook` or :mod:`certs`, or write to the cluster
itself (:mod:`kube.policy_reports` does, when asked; :mod:`kube.node_annotations` writes the
inventory annotation for ``gpuguard inventory``).
"""
