"""How `images import` restores a base image's name: as (repository, tag), whatever form the
spec's `image` took."""

from __future__ import annotations

import pytest

from retcon_sandbox.backends.docker.envtransfer import reference


@pytest.mark.parametrize(("name", "expected"), [
    ("retcon-sandbox/base:3a9ce7d199dd", ("retcon-sandbox/base", "3a9ce7d199dd")),
    ("plain", ("plain", "latest")),  # a name without a tag is `latest`
    ("registry:5000/team/base", ("registry:5000/team/base", "latest")),  # a port, no tag
    ("registry:5000/team/base:v2", ("registry:5000/team/base", "v2")),
    ("base@sha256:" + "a" * 64, None),  # by digest: no tag can restore it
])
def test_a_base_image_name_splits_as_the_engine_reads_it(name: str,
                                                        expected: tuple[str, str] | None) -> None:
    assert reference(name) == expected
