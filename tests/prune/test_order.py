"""Removal order: at every instant of a prune, each entry reads as it was or as absent.

For every kind of entry the runtimes and neffcache write, every prefix of the removal phases
and every subset of the phase in progress (S3's DeleteObjects removes a batch in no set order)
is classified the way a reader would: committed in its original state, or not there.
"""

from __future__ import annotations

import itertools

import pytest

from neffcache.entry import Entry, EntryState, FileInfo
from neffcache.layouts import LAYOUTS
from neffcache.prune import delete_order
from neffcache.scan.report import group_files

A = "trn2-lnc2/neuronxcc-2.27.5334.0+f702b353/MODULE_1+abb26765"
A_RT = "neuronxcc-2.21.33363.0+82129205/MODULE_2+abb26765"
KEY = "ab" + "cd" + "e" * 60
B = "trn2-lnc2/torchneuron-2.27.5334.0+f702b353"
B_NEFF = f"neff/ab/cd/{KEY}"
B_HLO = f"hlo/ab/cd/{KEY}"

CASES = {
    "A published": (A, ["neffcache.json", "model.hlo_module.pb", "compile_flags.json", "model.neff", "model.done"]),
    "A runtime 2.15+": (A_RT, ["model.hlo_module.pb", "compile_flags.json", "model.neff", "model.done"]),
    "A runtime legacy": (A_RT, ["model.hlo_module.pb", "compile_flags.txt", "model.neff"]),
    "A legacy ingested": (A_RT, ["neffcache.json", "model.hlo_module.pb", "compile_flags.txt", "model.neff"]),
    "A failed": (A_RT, ["model.hlo_module.pb", "compile_flags.json", "model.log"]),
    "A empty": (A_RT, ["model.hlo_module.pb", "compile_flags.json"]),
    "A locked": (A_RT, ["model.hlo_module.pb", "compile_flags.json", "model.hlo_module.pb.lock"]),
    "A uncommitted": (A, ["neffcache.json", "model.hlo_module.pb", "model.neff"]),
    "B published": (B, [f"{B_NEFF}.neffcache.json", f"{B_HLO}.hlo", f"{B_HLO}.flags.json", f"{B_NEFF}.neff"]),
    "B runtime": (B, [f"{B_HLO}.hlo", f"{B_HLO}.flags.json", f"{B_NEFF}.neff"]),
    "B bare": ("", [f"ab/cd/{KEY}.neff"]),
    "B bare with manifest": ("", [f"ab/cd/{KEY}.neffcache.json", f"ab/cd/{KEY}.neff"]),
}


def read(base: str, names: set[str]) -> Entry | None:
    infos = [FileInfo(f"{base}/{n}" if base else n, 10, 1.0) for n in names]
    groups, garbage, _ = group_files(infos)
    assert not garbage
    if not groups:
        return None
    (group,) = groups.values()
    layout = LAYOUTS[group.located.namespace.layout]
    return layout.classify(group.located, group.files, None)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_intermediate_state_reads_as_before_or_absent(case: str) -> None:
    base, names = CASES[case]
    before = read(base, set(names))
    assert before is not None
    phases = delete_order(before)
    assert sorted(p for phase in phases for p in phase) == sorted(f"{base}/{n}" if base else n for n in names)
    if before.manifest_name in before.files:
        # neffcache's own entries: the publish order reversed, the commit marker first.
        assert before.store_path(before.manifest_name) in phases[-1]
        if before.marker_name in before.files:
            assert before.store_path(before.marker_name) in phases[0]
    gone: set[str] = set()
    prefix = f"{base}/" if base else ""
    for phase in phases:
        names_in_phase = [p[len(prefix):] for p in phase]
        for k in range(len(names_in_phase) + 1):
            for removed in itertools.combinations(names_in_phase, k):
                left = set(names) - gone - set(removed)
                now = read(base, left)
                if now is None or not now.committed:
                    continue  # absent to every reader
                if before.state is EntryState.LOCKED:
                    continue  # removing a stale lock is the point; the rest follows the entry's own rules
                assert now.state is before.state, (case, sorted(left), now.state)
                if now.state is EntryState.SUCCESS:
                    assert now.marker_name in left and any(n.endswith(".neff") for n in left)
        gone |= set(names_in_phase)
    assert gone == set(names)
