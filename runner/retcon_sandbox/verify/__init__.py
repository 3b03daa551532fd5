"""Build and test verification: the stages run in a sandbox, the cache in git notes, the live
table, and the worker pool."""
