"""Which entries a size budget evicts first: the value policy (the default) or least recently used.

An entry's value is what losing it costs: the compile seconds its next miss pays again (x the
instance price when one is given), times how likely that miss is (its hits, decaying with the
time since its last use), per byte it occupies. The value policy evicts the lowest value
density first. It is Greedy-Dual-Size-Frequency (Cherkasova, 1998) without its running clock,
which a prune run every few hours has nowhere to keep:

- GDSF ranks by ``L + F x C / S``, where ``L`` is an inflation clock that rises with every
  eviction, so an entry not touched for long sinks below newcomers however valuable it was.
- This module ranks by ``F x C / S x 2 ** -(age / half_life)``. In logarithms that is
  ``log(F x C / S) + last_use x ln 2 / half_life - now x ln 2 / half_life``: the value term of
  GDSF plus a clock that is the time of last use. The ``now`` term is the same for every entry,
  so **the order does not depend on when it is computed** — a prune today and a prune tomorrow
  agree on which of two untouched entries goes first, and an online cache (the bench) keeps it
  in a heap without re-scoring anything (:func:`log_priority`).

One thing peers cannot know and neffcache does: a compiler bump. Every entry of a toolchain
older than the newest of its target (and LNC) is *superseded*: only jobs still on the old image
can hit it, and its hits say nothing about tomorrow. Superseded entries go before every entry
of the newest toolchain, by value among themselves (:func:`rank`). Without this rule a
frequency-weighted policy keeps yesterday's popular graphs long after the bump
(bench/retention_bench.py, traces ``bumps`` and ``mixed``).

``F`` is ``1 + hits`` (an entry nobody hit yet still cost its compile), ``C`` is
:func:`cost`, ``S`` at least one byte. Least recently used (``lru``) orders by last use alone,
ties largest first: the order ``prune --max-size`` used before this module.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from neffcache.errors import ConfigError

# The cost of an entry with no recorded compile time (a runtime wrote it, no manifest says):
# a minute, a typical compile of a mid-sized graph. Plans report how many entries were costed so.
DEFAULT_COMPILE_SECONDS = 60.0
# How fast the chance of another hit fades without use: a graph not used for a week counts
# half as likely to be needed as one used now. Weekly jobs sit at the knee.
DEFAULT_HALF_LIFE = 7 * 86400.0
MIB = float(1 << 20)
_LN2 = math.log(2.0)


class Retention(enum.StrEnum):
    """What ``--max-size`` evicts first (``--policy``)."""

    VALUE = "value"  # lowest value density: recompute cost x reuse likelihood per byte
    LRU = "lru"  # least recently used, ties largest first


class Holding(Protocol):
    """What the policy needs of an entry held by a store (a prune candidate, a bench slot)."""

    @property
    def size(self) -> int: ...
    @property
    def compile_seconds(self) -> float | None: ...
    @property
    def hits(self) -> int: ...
    @property
    def used(self) -> float: ...


H = TypeVar("H", bound=Holding)


@dataclass(frozen=True)
class ValuePolicy:
    """The value policy's parameters. ``price_per_hour`` turns seconds into money; one price
    for every entry scales every score alike and changes no order, so it matters only when
    entries of differently priced instances share a budget."""

    half_life: float = DEFAULT_HALF_LIFE
    default_compile_seconds: float = DEFAULT_COMPILE_SECONDS
    price_per_hour: float | None = None

    def __post_init__(self) -> None:
        if not self.half_life > 0:
            raise ConfigError(f"the value policy's half-life must be positive, not {self.half_life:g}")
        if not self.default_compile_seconds > 0:
            raise ConfigError("the default compile time must be positive, not "
                              f"{self.default_compile_seconds:g}")
        if self.price_per_hour is not None and not self.price_per_hour > 0:
            raise ConfigError(f"an instance price must be positive, not {self.price_per_hour:g}")


def compile_seconds(h: Holding, policy: ValuePolicy) -> float:
    """The recorded compile time, or the stated default when none is (or it is not positive:
    a zero would make the entry worthless, which an unknown cost is not)."""
    seconds = h.compile_seconds
    return seconds if seconds is not None and seconds > 0 and math.isfinite(seconds) \
        else policy.default_compile_seconds


def cost(h: Holding, policy: ValuePolicy) -> float:
    """What the next miss of ``h`` costs: compile seconds, or dollars with a price."""
    seconds = compile_seconds(h, policy)
    return seconds * policy.price_per_hour / 3600.0 if policy.price_per_hour else seconds


def log_priority(h: Holding, policy: ValuePolicy) -> float:
    """The log of ``h``'s score up to a term common to every entry: larger stays longer. The
    same at any time, so it can key a heap."""
    frequency = 1 + max(h.hits, 0)
    return (math.log(cost(h, policy)) + math.log(frequency) - math.log(max(h.size, 1))
            + h.used * _LN2 / policy.half_life)


def rank(h: Holding, policy: ValuePolicy, superseded: bool = False) -> tuple[int, float]:
    """The value policy's sort key, smallest evicted first: superseded entries, then by
    :func:`log_priority`."""
    return (0 if superseded else 1, log_priority(h, policy))


def score(h: Holding, policy: ValuePolicy, now: float) -> float:
    """``h``'s value density at ``now``: expected recompute cost avoided per MiB kept (compile
    seconds x (1 + hits) x 2^-(age / half-life) / MiB). What a plan shows for each eviction."""
    age = max(now - h.used, 0.0)
    frequency = 1 + max(h.hits, 0)
    decay: float = 2.0 ** (-age / policy.half_life)
    return cost(h, policy) * frequency * decay / (max(h.size, 1) / MIB)


def eviction_order(holdings: Iterable[H], retention: Retention, policy: ValuePolicy | None = None,
                   superseded: Callable[[H], bool] | None = None) -> list[H]:
    """``holdings`` in the order a budget evicts them, first to go first. Deterministic: ties
    go largest first (fewer removals for the same bytes), then by the order given.
    ``superseded`` says which belong to an older toolchain than the newest of their target
    (the value policy only: LRU is the old order, kept as it was)."""
    items: Sequence[H] = list(holdings)
    if retention is Retention.LRU:
        return sorted(items, key=lambda h: (h.used, -h.size))
    chosen = policy or ValuePolicy()
    old = superseded or (lambda _h: False)
    return sorted(items, key=lambda h: (*rank(h, chosen, old(h)), -h.size))
