"""Serve a tiny locally built model with the plugin loaded (tests, demo, benchmarks)."""
