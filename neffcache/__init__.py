"""neffcache: compile-cache management for AWS Neuron (Trainium / Inferentia)."""

from __future__ import annotations

__version__ = "0.1.0"
