"""Work on one store: publishing an entry whole (`publish`), copying entries in from a
runtime's directory (`ingest`), verifying digests (`verify`) and the `NeffCache` get/put facade
(`cache`). Scanning a store is the scan engine's (neffcache/scan/).

Imports values, stores, layouts, the scan engine and coordination only (docs/architecture.md).
"""
