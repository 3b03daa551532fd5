"""The history spec: the TOML file, its byte-exact text edits, the history log, the sandbox
settings it may lower, and the run's state folder. No I/O beyond the spec file and that folder."""
