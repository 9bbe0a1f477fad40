"""Fixtures shared by the end-to-end tests."""

import pytest

from minicomp.dispatch import chunked_rows


@pytest.fixture
def own_regions():
    """This process's registry of chunked regions (chunked_rows.REGIONS) empty for the test, then as
    it was: a region an earlier test made (its joints compiled) is not this test's to reuse."""
    earlier = dict(chunked_rows.REGIONS)
    chunked_rows.REGIONS.clear()
    yield chunked_rows.REGIONS
    chunked_rows.REGIONS.clear()
    chunked_rows.REGIONS.update(earlier)
