"""The continuous audit (``gpuguard audit --cluster --watch``): the cluster kept in memory, the
PolicyReports kept current as it changes, and the metrics of its GPU state."""
