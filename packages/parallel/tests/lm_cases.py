"""A language model of plain ``torch.nn`` layers and how the wrapper tests train it, shared by the tests and
by ``torchrun_worker.py`` (``conftest`` puts this folder on ``sys.path``)."""

import torch
from parallel import DDP, FSDP, BucketedDDP, FlatDDP, NaiveDDP
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


# every wrapper of the DDP family and FSDP; a tiny bucket cap, so that BucketedDDP makes several buckets
WRAPPERS = {
    "naive": NaiveDDP,
    "flat": FlatDDP,
    "ddp": DDP,
    "bucketed": lambda m: BucketedDDP(m, bucket_size_mb=1e-4),
    "fsdp": FSDP,
}


def rank_rows(rank: int, world_size: int, rows: int) -> slice:
    """This rank's share of ``rows`` sequences; the ranks' shares cover them once, in order."""
    return slice(rank * rows // world_size, (rank + 1) * rows // world_size)


def train_step(model, opt, step: int, rows: int, rank: int = 0, world_size: int = 1) -> None:
    """One step on this rank's share of ``lm_batch(step, rows)``: backward, the wrapper's gradient
    synchronization where it has one, the optimizer step."""
    x, y = lm_batch(step, rows)
    share = rank_rows(rank, world_size, rows)
    lm_loss(model, x[share], y[share]).backward()
    if hasattr(model, "finish_gradient_synchronization"):
        model.finish_gradient_synchronization()
    opt.step()
    opt.zero_grad()
