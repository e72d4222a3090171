"""What an hour of an instance costs, as the operator says: turns compile hours into money.

neffcache ships no prices. They differ by region, purchase option (on-demand, reserved,
capacity blocks) and contract, and change without notice, so a built-in table would be wrong
for most operators and silently so. The operator gives ``instance type -> price per hour`` and a
currency label; without them every figure stays in hours.

The arithmetic is one rule, applied wherever money is shown (stats, dashboard, /metrics):
``cost = seconds / 3600 * price[instance_type]`` for the instance type an event was reported
with. Seconds of an instance type with no price are *unpriced*: reported beside the money, never
priced at zero, because a total that quietly leaves hours out reads as a saving that is not there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from neffcache.server.config import ServerSettings


@dataclass(frozen=True)
class Prices:
    """Price per hour by instance type, in ``currency``; empty when the operator gave none."""

    per_hour: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    currency: str = "USD"

    @property
    def configured(self) -> bool:
        return bool(self.per_hour)

    def cost(self, seconds: float, instance_type: str) -> float | None:
        """What ``seconds`` of ``instance_type`` cost, or None when that type has no price."""
        price = self.per_hour.get(instance_type)
        return None if price is None else seconds / 3600.0 * price


NO_PRICES = Prices()


def prices_of(settings: ServerSettings) -> Prices:
    """The prices ``settings`` give (checked there: known instance types, sane amounts)."""
    return Prices(MappingProxyType(dict(settings.prices)), settings.currency) if settings.prices else NO_PRICES
