"""The store contract: every backend runs these tests (fsspec's ``tests/abstract`` habit).

A backend's test module subclasses :class:`StoreContract` and provides a ``store`` fixture
that yields an empty, writable store; where it can, it adds :class:`ReadOnlyContract` and a
``readonly_store`` fixture. The class attributes ``on_local_filesystem``, ``single_writer``
and ``created_on_open`` say what the store must report about itself::

    class TestMyStore(StoreContract, ReadOnlyContract):
        @pytest.fixture
        def store(self, tmp_path): ...

One module per operation (writes, reads, listing, deletes, moves, staging, paths, backend),
then what is built on the primitives (entries, leases). These modules import pytest: only
test code imports this package (``import neffcache.testing`` alone stays free of it).
:mod:`.sample` publishes a sample entry for tests of anything that needs one.
"""

from __future__ import annotations

from neffcache.testing.store_contract.backend import BackendContract
from neffcache.testing.store_contract.deletes import DeleteContract
from neffcache.testing.store_contract.entries import EntryContract
from neffcache.testing.store_contract.leases import LeaseContract
from neffcache.testing.store_contract.listing import ListingContract
from neffcache.testing.store_contract.moves import MoveContract
from neffcache.testing.store_contract.paths import PathContract
from neffcache.testing.store_contract.readonly import ReadOnlyContract
from neffcache.testing.store_contract.reads import ReadContract
from neffcache.testing.store_contract.sample import LAYOUT_A, TC, publish_a
from neffcache.testing.store_contract.staging import StagingContract
from neffcache.testing.store_contract.writes import WriteContract


class StoreContract(WriteContract, ReadContract, ListingContract, DeleteContract, MoveContract,
                    StagingContract, PathContract, BackendContract, EntryContract, LeaseContract):
    """Every operation's contract: what a backend's test class subclasses."""


__all__ = [
    "LAYOUT_A", "TC", "BackendContract", "DeleteContract", "EntryContract", "LeaseContract", "ListingContract",
    "MoveContract", "PathContract", "ReadContract", "ReadOnlyContract", "StagingContract", "StoreContract",
    "WriteContract", "publish_a",
]
