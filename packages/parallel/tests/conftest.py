"""A language model made of plain ``torch.nn`` layers, shared by the tests of every wrapper."""

import pytest
import torch
from torch import nn

VOCAB, WIDTH, HIDDEN = 29, 12, 19


class TorchLM(nn.Module):
    """Embedding, LayerNorm, Linear layers with biases, the LM head tied to the embedding, a persistent and a
    non-persistent buffer. ``(batch, seq)`` token ids -> ``(batch, seq, VOCAB)`` logits."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor(0.75))
        self.register_buffer("positions", torch.arange(64.0) / 64, persistent=False)

    def forward(self, ids):
        x = self.embed(ids) + self.positions[: ids.shape[-1], None]
        x = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return self.head(x) * self.scale


def torch_lm(seed: int = 0, dtype: torch.dtype = torch.float32) -> TorchLM:
    torch.manual_seed(seed)
    return TorchLM().to(dtype)


def lm_batch(step: int, rows: int, seq: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` sequences of ``seq`` tokens and their next-token targets, the same for a given ``step``."""
    gen = torch.Generator().manual_seed(4099 * step + 13)
    ids = torch.randint(0, VOCAB, (rows, seq + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


def lm_loss(model, ids, targets):
    return nn.functional.cross_entropy(model(ids).flatten(0, 1), targets.flatten())


@pytest.fixture
def lm():
    """``(torch_lm, lm_batch, lm_loss)``."""
    return torch_lm, lm_batch, lm_loss
