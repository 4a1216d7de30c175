"""Shared fixtures of the parallel tests; the plain-torch language model lives in ``lm_cases``."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from lm_cases import lm_batch, lm_loss, torch_lm


@pytest.fixture
def lm():
    """``(torch_lm, lm_batch, lm_loss)``."""
    return torch_lm, lm_batch, lm_loss
