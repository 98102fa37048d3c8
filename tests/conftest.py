"""Shared test setup."""

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_torch_compile():
    """Each test starts with torch.compile's caches empty. torch.compile counts recompilations per function, and
    every StaticCacheGenerator compiles the same method: tests that compile many small models in one process would
    otherwise exhaust the limit (8) for the tests after them (docs/generation.md says so for users, too)."""
    torch._dynamo.reset()
    yield
