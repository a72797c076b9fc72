"""Compatibility with what real clients do (issue 12): shared fixtures are in tests/conftest.py."""
