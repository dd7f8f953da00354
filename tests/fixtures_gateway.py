"""Fixtures for the gateway component (filled in by its tests)."""
