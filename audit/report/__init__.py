"""Reports of a scan result: the report document, its tables, PolicyReports and history.

Owns :mod:`~audit.report.assemble` (the JSON-ready report of a
:class:`audit.scan.result.ScanResult`, ``docs/audit-report.md``), :mod:`~audit.report.tables`
(the tables every renderer shares), :mod:`~audit.report.policy_reports`
(``wgpolicyk8s.io/v1alpha2``) and :mod:`~audit.report.history` (runs in SQLite). Reads the scan
result only: must not import the scanner (import-linter).
"""
