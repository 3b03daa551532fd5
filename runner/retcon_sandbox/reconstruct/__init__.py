"""The reconstruction: a short engine that drives the steps over a run's context."""
