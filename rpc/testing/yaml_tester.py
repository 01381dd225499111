"""Replay-testing kit for method-reader components."""
