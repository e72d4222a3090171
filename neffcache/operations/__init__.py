"""Work on one store: scanning it (`scan`), publishing an entry whole (`publish`), copying
entries in from a runtime's directory (`ingest`), verifying digests (`verify`) and the
`NeffCache` get/put facade (`cache`).

Imports values, stores, layouts and coordination only (docs/architecture.md).
"""
