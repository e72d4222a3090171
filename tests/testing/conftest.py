"""The `sim` fixture lives in tests/conftest.py (tests/simulation.py) so every suite can use it."""
