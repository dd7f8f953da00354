"""Fixtures for the store component (filled in by its tests)."""
