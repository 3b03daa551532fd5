"""Drafting a history spec from a messy branch: pure functions over facts the command reads."""
