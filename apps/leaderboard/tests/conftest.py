"""Shared fixtures of the app's tests."""

import numpy as np
import pytest
import torch
from leaderboard.tokens import write_tokens


@pytest.fixture(scope="session")
def token_files(tmp_path_factory):
    """Byte-level files of 17 small made-up sources (train) and 3 (held out)."""
    root = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "import", "class", "for", "in", "if", "else", "(x)", ":", "\n    "]
    for i in range(20):
        text = " ".join(rng.choice(words, size=400 + 37 * i))
        (root / f"m{i:02d}.py").write_text(text)
    out = tmp_path_factory.mktemp("tokens")
    write_tokens(out, root, valid_fraction=0.15)
    return out / "train.bin", out / "valid.bin"


@pytest.fixture(scope="module")
def enough_recompiles():
    """For modules that compile the same regions at many sizes and dtypes: room for every recompile, so that
    Dynamo never falls back to running them eagerly (the compiled kernels would go untested)."""
    with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
        yield
