"""Audit inputs: the objects to scan, from snapshot files or a live cluster.

Owns :mod:`~audit.sources.files` (snapshot files, streamed item by item when large) and
:mod:`~audit.sources.cluster` (a live cluster through :mod:`kube.lists`, read-only). Must not
scan, judge or report.
"""
