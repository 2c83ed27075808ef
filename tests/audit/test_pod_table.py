"""The audit's per-pod table (audit/scan/pod_table.py): a pod read twice is told, each keeps
its controller, through the table's growth and slots shared by identities' low bits."""

from __future__ import annotations

import random

from audit.scan.ownership import ObjectKey
from audit.scan.pod_table import PodTable

RS = ObjectKey("ml", "apps", "ReplicaSet", "trainer-7c9d8")


def test_a_pod_added_twice_is_told_and_the_first_owner_stays():
    table = PodTable()
    assert table.add(hash(("ml", "trainer-7c9d8-abcde")), RS) == RS
    assert table.add(hash(("ml", "trainer-7c9d8-abcde")), None) is False
    assert table.owner(hash(("ml", "trainer-7c9d8-abcde"))) == RS
    assert len(table) == 1


def test_owners_are_one_shared_key_object_per_controller():
    table = PodTable()
    first = table.add(1001, ObjectKey("ml", "apps", "ReplicaSet", "trainer-7c9d8"))
    second = table.add(1002, ObjectKey("ml", "apps", "ReplicaSet", "trainer-7c9d8"))
    assert first is second
    assert table.add(1003, None) is None
    assert table.owner(1003) is None
    assert table.owner(4242) is None and 4242 not in table


def test_a_hundred_thousand_pods_through_growth_and_shared_slots():
    rng = random.Random(20261204)
    table = PodTable()
    owners = [ObjectKey("ns", "apps", "ReplicaSet", f"rs-{i}") for i in range(97)]
    # identities equal in their low 20 bits start at the same slot; negative ones (Python's
    # hash of a tuple often is) are taken as their low 64 bits
    identities = [rng.getrandbits(44) << 20 for _ in range(50_000)]
    identities += [-(rng.getrandbits(63)) for _ in range(50_000)]
    for number, identity in enumerate(identities):
        assert table.add(identity, owners[number % 97] if number % 5 else None) is not False
    assert len(table) == 100_000
    for number, identity in enumerate(identities):
        assert identity in table
        assert table.owner(identity) == (owners[number % 97] if number % 5 else None)
        assert table.add(identity, None) is False
    assert len(table) == 100_000


def test_identities_equal_in_their_low_64_bits_are_one_pod():
    table = PodTable()
    table.add(5, RS)
    assert table.add(5 + (1 << 64), None) is False
    table.add(0, None)
    assert 1 in table  # identity 0 counts as 1 (0 marks an empty slot)
