from __future__ import annotations

import time
from pathlib import Path

from neffcache.coordination.stamps import last_used, record_use
from neffcache.stores.local import LocalStore


def test_record_and_read_last_use(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "c")
    before = time.time()
    assert record_use(store, ["trn2-lnc2/neuronxcc-2.27/MODULE_1+a", "trn2-lnc2/neuronxcc-2.27/MODULE_1+a",
                              "trn1-lnc1/torchneuron-2.27/neff/ab/cd/abcd"]) == 2
    used = last_used(store)
    assert set(used) == {"trn2-lnc2/neuronxcc-2.27/MODULE_1+a", "trn1-lnc1/torchneuron-2.27/neff/ab/cd/abcd"}
    assert all(t >= before - 1 for t in used.values())
    assert set(last_used(store, "trn1-lnc1")) == {"trn1-lnc1/torchneuron-2.27/neff/ab/cd/abcd"}
    assert record_use(LocalStore(tmp_path / "c", read_only=True), ["x/y"]) == 0
