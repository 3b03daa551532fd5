"""`execute`'s overlap of one commit with the next (`--pipeline`, `--no-pipeline`): one enum
for the parser, the default, the run's options and the steps, which all named it by text."""

from __future__ import annotations

from enum import StrEnum


class Pipeline(StrEnum):
    OFF = "off"  # one thing at a time
    WARM = "warm"  # the next commit's sandbox is opened while this one builds and tests
    FULL = "full"  # and the model extracts the next commit ahead (steps/speculate.py)
