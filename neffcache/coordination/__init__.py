"""What one process tells the others through a store: lease files and their takeover
(`lease`), the publish and prune-group leases that keep an entry's writers apart
(`write_leases`), last-use stamps (`stamps`) and the prune journal's record (`history`).

Each module is the single home of the file names and formats it writes. Imports values,
stores and layouts only (docs/architecture.md).
"""
