"""Shared fixtures: the tiny preset at awkward sizes, on CPU."""

import pytest
from cs336_basics import get_preset


@pytest.fixture
def tiny():
    """Tiny model, batch 3, context 17 (nothing a power of two)."""
    return get_preset("tiny").with_(context_length=17, batch_size=3, num_layers=3)
