"""The instance catalog: which compile target and LNC an instance type implies.

From docs/runtimes.md, "Instance catalog". The compiler's ``--lnc`` must match the runtime's
``NEURON_LOGICAL_NC_CONFIG``, so the default LNC is part of the toolchain a NEFF is valid for.
"""

from __future__ import annotations

from dataclasses import dataclass

from neffcache.errors import UnknownInstanceType

TARGETS = ("trn1", "trn2", "trn3", "inf2")


@dataclass(frozen=True)
class InstanceType:
    name: str
    target: str
    default_lnc: int
    neuron_cores: int
    verified: bool = True  # False where the public sources could not confirm the row

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


def _row(name: str, target: str, lnc: int, cores: int, verified: bool = True) -> InstanceType:
    return InstanceType(name, target, lnc, cores, verified)


CATALOG: dict[str, InstanceType] = {
    row.name: row
    for row in (
        _row("trn1.2xlarge", "trn1", 1, 2),
        _row("trn1.32xlarge", "trn1", 1, 32),
        _row("trn1n.32xlarge", "trn1", 1, 32),
        # inf2 compiles with --target trn1 (inf2 is accepted too); the NEFFs are interchangeable.
        _row("inf2.xlarge", "trn1", 1, 2),
        _row("inf2.8xlarge", "trn1", 1, 2),
        _row("inf2.24xlarge", "trn1", 1, 12),
        _row("inf2.48xlarge", "trn1", 1, 24),
        _row("trn2.3xlarge", "trn2", 2, 4, verified=False),
        # 64 logical cores at the default LNC=2 (128 physical at LNC=1).
        _row("trn2.48xlarge", "trn2", 2, 64),
        _row("trn2u.48xlarge", "trn2", 2, 64),
        # trn3 names are not public yet; the target and LNC are.
        _row("trn3.3xlarge", "trn3", 2, 8, verified=False),
        _row("trn3.48xlarge", "trn3", 2, 128, verified=False),
        _row("trn3u.48xlarge", "trn3", 2, 128, verified=False),
    )
}


def known_instance_types() -> list[str]:
    return sorted(CATALOG)


def lookup_instance(name: str) -> InstanceType:
    """The catalog row for ``name`` (case and surrounding space ignored)."""
    row = CATALOG.get(name.strip().lower())
    if row is None:
        raise UnknownInstanceType(name, known_instance_types())
    return row
