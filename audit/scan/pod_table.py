"""The audit's per-pod table: which pods the scan has read, and each one's controller.

Owns the one structure of the audit that grows with the pod count (a million pods in a large
cluster): a flat open-addressing hash table of the pods' 64-bit identities (the hash of
``(namespace, name)``) with a parallel array of controller indexes, one shared key object per
controller. 12 bytes a slot at a load of at most one half: ~24 MiB for a million pods, where a
dict of int objects took ~74 MiB and left a long-lived 32-byte object per pod scattered among the
freed pod bodies (the allocator could then return none of their pools).

Must not read objects or decide what a pod is owned by (:mod:`audit.scan.ownership` does).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from audit.scan.ownership import ObjectKey

_BITS = (1 << 64) - 1
# Fibonacci hashing: the slot is the top bits of identity x 2^64/phi, so identities that differ
# only in their high bits (or share their low ones) still spread over the table.
_GOLDEN = 0x9E3779B97F4A7C15
_INITIAL_LOG2 = 12  # 4,096 slots (48 KiB): a small snapshot never grows the table


class PodTable:
    """Pods read so far, by identity (any int; ``hash((namespace, name))`` in the audit), each
    with its controller's key or None.

    Two identities equal in their low 64 bits are one pod (as two colliding hashes were before
    this table: the chance is ~n²/2⁶⁵, 3·10⁻⁸ for a million pods); identity 0 counts as 1.
    """

    __slots__ = ("_count", "_hashes", "_index", "_keys", "_mask", "_owners", "_shift")

    def __init__(self) -> None:
        size = 1 << _INITIAL_LOG2
        self._hashes = array("Q", bytes(8 * size))  # 0: an empty slot
        self._owners = array("I", bytes(4 * size))  # 0: no controller, else 1 + index in _keys
        self._keys: list[ObjectKey] = []
        self._index: dict[ObjectKey, int] = {}
        self._mask = size - 1
        self._shift = 64 - _INITIAL_LOG2
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, identity: int, owner: ObjectKey | None) -> ObjectKey | bool | None:
        """Record a pod: False when a pod of this identity was added before (nothing changes),
        else the shared key object equal to ``owner`` (None when it has none)."""
        value = identity & _BITS or 1
        hashes, mask = self._hashes, self._mask
        slot = ((value * _GOLDEN) & _BITS) >> self._shift
        while True:
            found = hashes[slot]
            if found == value:
                return False
            if not found:
                break
            slot = (slot + 1) & mask
        shared = None
        if owner is not None:
            number = self._index.get(owner)
            if number is None:
                number = self._index[owner] = len(self._keys) + 1
                self._keys.append(owner)
            shared = self._keys[number - 1]
            self._owners[slot] = number
        hashes[slot] = value
        self._count += 1
        if self._count * 2 > mask:
            self._grow()
        return shared

    def _slot(self, identity: int) -> int:
        """The slot holding ``identity``, or -1."""
        value = identity & _BITS or 1
        hashes, mask = self._hashes, self._mask
        slot = ((value * _GOLDEN) & _BITS) >> self._shift
        while True:
            found = hashes[slot]
            if found == value:
                return slot
            if not found:
                return -1
            slot = (slot + 1) & mask

    def __contains__(self, identity: int) -> bool:
        return self._slot(identity) >= 0

    def owner(self, identity: int) -> ObjectKey | None:
        """The controller recorded with ``identity``; None when it has none or is absent."""
        slot = self._slot(identity)
        number = self._owners[slot] if slot >= 0 else 0
        return self._keys[number - 1] if number else None

    def _grow(self) -> None:
        old_hashes, old_owners = self._hashes, self._owners
        size = 2 * len(old_hashes)
        hashes = array("Q", bytes(8 * size))
        owners = array("I", bytes(4 * size))
        mask = size - 1
        shift = self._shift - 1
        for slot, value in enumerate(old_hashes):
            if value:
                new = ((value * _GOLDEN) & _BITS) >> shift
                while hashes[new]:
                    new = (new + 1) & mask
                hashes[new] = value
                owners[new] = old_owners[slot]
        self._hashes, self._owners, self._mask, self._shift = hashes, owners, mask, shift
