"""The in-container helper, shipped as data (its source is sent to each sandbox's python3)."""
