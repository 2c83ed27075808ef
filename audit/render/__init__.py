"""Renderers of an audit report: terminal, Markdown, HTML (with SVG charts).

Each turns the report document into text through :mod:`audit.report.tables`; must not compute
figures of its own.
"""
