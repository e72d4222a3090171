"""Benchmarks: each one measures neffcache against a baseline in the same run and prints the ratio."""
