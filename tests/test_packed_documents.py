"""The packages together: ``BasicsTransformerLM`` on a packed batch, with ``flashattn.packed_attention`` in
its attention slot and positions restarting in each document, trains as its documents do one by one."""

import pytest
import torch
import torch.nn.functional as F
from cs336_basics.model import BasicsTransformerLM
from flashattn import cu_seqlens_from_doc_ids, flash_attention, packed_attention, positions_in_documents

LENGTHS = [5, 1, 17, 0, 9]  # an empty document too


def _model(device, dtype):
    torch.manual_seed(0)
    sizes = {
        "vocab_size": 61,
        "context_length": 64,
        "d_model": 64,
        "num_layers": 2,
        "num_heads": 4,
        "d_ff": 96,
    }
    return BasicsTransformerLM(**sizes, attention_fn=flash_attention, device=device, dtype=dtype)


def _loss(model, tokens, targets, token_positions=None):
    """Summed next-token loss (in the model's dtype) of one row of tokens; targets of -1 are not scored."""
    logits = model(tokens[None], token_positions)[0]
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction="sum"), logits


def _packed_vs_one_by_one(device, dtype):
    gen = torch.Generator().manual_seed(1)
    docs = [torch.randint(0, 61, (n,), generator=gen).to(device) for n in LENGTHS]
    targets = [torch.cat([d[1:], torch.tensor([-1], device=device)]) if len(d) else d for d in docs]

    alone = _model(device, dtype)
    pairs = [(d, t) for d, t in zip(docs, targets, strict=True) if len(d)]
    losses, logits = zip(*(_loss(alone, d, t) for d, t in pairs), strict=True)
    sum(losses).backward()

    packed = _model(device, dtype)
    tokens = torch.cat(docs)
    doc_ids = torch.cat([torch.full((n,), i, device=device) for i, n in enumerate(LENGTHS)])
    cu_seqlens, longest = cu_seqlens_from_doc_ids(doc_ids)
    packed.set_attention_fn(packed_attention(cu_seqlens, longest))
    loss, packed_logits = _loss(packed, tokens, torch.cat(targets), positions_in_documents(cu_seqlens))
    loss.backward()
    return (sum(losses), torch.cat(logits), alone), (loss, packed_logits, packed)


def _check(alone, packed, atol, rtol):
    for a, b in zip(alone[:2], packed[:2], strict=True):
        torch.testing.assert_close(b, a, atol=atol, rtol=rtol)
    for (name, p), q in zip(alone[2].named_parameters(), packed[2].parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=atol, rtol=rtol, msg=lambda m, n=name: f"{n}: {m}")


def test_packed_batch_matches_documents_one_by_one_cpu():
    # float64 model, but the rotary embedding rotates in fp32: gradients agree to fp32 rounding
    _check(*_packed_vs_one_by_one("cpu", torch.float64), atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
def test_packed_batch_matches_documents_one_by_one_triton():
    alone, packed = _packed_vs_one_by_one("cuda", torch.float32)  # tf32x3 dots: close to fp32
    _check(alone, packed, atol=2e-4, rtol=2e-3)


def test_token_positions_of_the_wrong_length_are_refused():
    model = _model("cpu", torch.float32)
    with pytest.raises(ValueError, match="token_positions has shape"):
        model(torch.zeros(1, 8, dtype=torch.long), torch.arange(7))
