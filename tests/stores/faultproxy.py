"""Moved: the fault-injecting (and latency-adding) proxy is :mod:`neffcache.testing.faultproxy`,
where bench/ can import it too. This name stays for the tests written against it."""

from neffcache.testing.faultproxy import FaultProxy, Rule

__all__ = ["FaultProxy", "Rule"]
