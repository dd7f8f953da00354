"""Fixtures for the serving component (filled in by its tests)."""
