"""The NVML GPU inventory (``docs/inventory.md``).

Owns :mod:`~audit.inventory.nvml` (the only ``pynvml`` importer: backend protocol and loader),
:mod:`~audit.inventory.nvml_reader` (reading a machine's GPUs), the documents
(:mod:`~audit.inventory.model`, :mod:`~audit.inventory.summary`), ``--inventory`` inputs
(:mod:`~audit.inventory.files`), findings against the allocations (:mod:`~audit.inventory.join`)
and their place in an audit (:mod:`~audit.inventory.audit`). Independent of the scan.
"""
