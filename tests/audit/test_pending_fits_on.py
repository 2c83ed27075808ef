"""A pending pod's report entry names at most ``FITS_ON_LISTED`` of the nodes it fits on now.

Listing every one made the report grow with pending pods x nodes: at 100k pods / 5k nodes, 879
pending pods listed 236,152 node names (8.3 MB of the report's 26 MB of JSON); at 20,000 nodes
each such pod listed thousands. ``nodes.fit`` still counts them all, and the names listed are
the first in node name order, as before.
"""

from __future__ import annotations

import json

from audit.scan.placement import FITS_ON_LISTED
from benchmarks.audit import generate
from gpuguard.cli import main


def test_fits_on_names_the_first_nodes_and_nodes_fit_counts_them_all(tmp_path, capsys):
    generate(tmp_path, 1500, 400)  # the benchmark's mix: pending pods that fit on many nodes
    assert main(["audit", "-f", str(tmp_path), "-o", "json", "--jobs", "0"]) in (0, 1)
    pending = json.loads(capsys.readouterr().out)["pending"]
    many = [p for p in pending if p["nodes"]["fit"] > FITS_ON_LISTED]
    assert many, "the mix has pending pods that fit on more nodes than are listed"
    for entry in pending:
        fit, listed = entry["nodes"]["fit"], entry["fits_on"]
        assert len(listed) == min(fit, FITS_ON_LISTED), entry["pod"]
        assert listed == sorted(listed)  # node name order: the first of them
        assert (entry["reason"] == "fits-now") == (fit > 0), entry["pod"]
