"""What the CLI and the warmers start from: user settings (`config`), the environment a job is
pointed at (`jobenv`), the doctor's checks (`doctor`) and warm logs on disk (`warm_logs`).

The library's top layer: imports every layer below it, and nothing in the library imports it
(docs/architecture.md).
"""
