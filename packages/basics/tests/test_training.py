"""Optimizer, loss, clipping, schedule, batching and checkpoints against torch's own and by hand."""

import io
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cs336_basics import (
    PRESETS,
    AdamW,
    build_model,
    clip_gradients,
    cross_entropy,
    get_batch,
    get_lr_cosine_schedule,
    load_checkpoint,
    save_checkpoint,
)


def _toy_params(seed):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in ((7, 3), (13,), (2, 5, 3))]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_follows_torch_adamw(weight_decay):
    ours, theirs = _toy_params(0), _toy_params(0)
    kwargs = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    opt_a, opt_b = AdamW(ours, **kwargs), torch.optim.AdamW(theirs, **kwargs)
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        for pa, pb in zip(ours, theirs, strict=True):
            g = torch.randn(pa.shape, generator=gen, dtype=torch.float64)
            pa.grad, pb.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    for pa, pb in zip(ours, theirs, strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-10, atol=1e-12)


def test_adamw_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="lr"):
        AdamW(_toy_params(0), lr=-1)
    with pytest.raises(ValueError, match="betas"):
        AdamW(_toy_params(0), betas=(1.0, 0.9))


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e5])
def test_cross_entropy_matches_torch_on_large_logits(scale):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 101, dtype=torch.float64) * scale
    targets = torch.randint(0, 101, (3, 5))
    ours = cross_entropy(logits, targets)
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours.double(), F.cross_entropy(logits.reshape(-1, 101), targets.reshape(-1)))


def test_cross_entropy_gradient_and_shape_check():
    logits = torch.randn(17, 9, requires_grad=True)
    targets = torch.randint(0, 9, (17,))
    cross_entropy(logits, targets).backward()
    expected = (torch.softmax(logits.detach(), -1) - F.one_hot(targets, 9)) / 17
    torch.testing.assert_close(logits.grad, expected)
    with pytest.raises(ValueError, match="targets shape"):
        cross_entropy(logits, targets[:3])


def test_cross_entropy_refuses_float_targets_as_torch_does():
    logits, targets = torch.randn(7, 11), torch.tensor([0.0, 3.7, 10.2, 1.0, 2.0, 5.5, 9.9])
    with pytest.raises(RuntimeError):
        F.cross_entropy(logits, targets)  # torch: class ids must be integers
    with pytest.raises(TypeError, match=r"targets must hold integer class ids .* got dtype torch\.float32"):
        cross_entropy(logits, targets)
    with pytest.raises(TypeError, match=r"got dtype torch\.bool"):
        cross_entropy(logits, targets > 1)


@pytest.mark.parametrize("bad", [11, -1, 1000])
def test_cross_entropy_names_a_target_outside_the_vocabulary(bad):
    logits, targets = torch.randn(3, 5, 11), torch.randint(0, 11, (3, 5))
    targets[2, 3] = bad
    with pytest.raises(IndexError, match=rf"targets must lie in \[0, 11\) .*got {bad} at index \(2, 3\)"):
        cross_entropy(logits, targets)
    with pytest.raises(IndexError):
        F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))  # torch refuses it too


def test_cross_entropy_takes_narrow_integer_targets_and_compiles():
    logits, targets = torch.randn(4, 6, 13), torch.randint(0, 13, (4, 6))
    want = F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1))
    torch.testing.assert_close(cross_entropy(logits, targets.to(torch.int32)), want)
    torch.testing.assert_close(cross_entropy(logits, targets.to(torch.uint8)), want)
    torch.testing.assert_close(cross_entropy(logits, targets.to(torch.uint16)), want)  # a token file's ids
    with pytest.raises(IndexError, match=r"targets must lie in \[0, 13\).*got 60000"):
        cross_entropy(logits, torch.full((4, 6), 60000, dtype=torch.uint16))
    traced = torch.compile(cross_entropy, backend="eager", fullgraph=True)  # the range check traces
    torch.testing.assert_close(traced(logits, targets), want)


@pytest.mark.parametrize("max_norm", [0.1, 1e3])
def test_clip_gradients_matches_torch(max_norm):
    ours, theirs = _toy_params(2), _toy_params(2)
    for pa, pb in zip(ours, theirs, strict=True):
        pa.grad = torch.randn_like(pa)
        pb.grad = pa.grad.clone()
    norm_a = clip_gradients(ours, max_norm)
    norm_b = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    torch.testing.assert_close(norm_a.double(), norm_b)
    for pa, pb in zip(ours, theirs, strict=True):
        torch.testing.assert_close(pa.grad, pb.grad)


@pytest.mark.parametrize("max_norm", [-1.0, math.nan, math.inf])
def test_clip_gradients_refuses_a_negative_or_non_finite_max_norm(max_norm):
    params = _toy_params(3)
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match=r"max_l2_norm must be a finite number >= 0, got"):
        clip_gradients(params, max_norm)
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in params)  # untouched


def test_cosine_schedule():
    args = dict(max_learning_rate=1.0, min_learning_rate=0.1, warmup_iters=10, cosine_cycle_iters=110)
    assert get_lr_cosine_schedule(0, **args) == 0.0
    assert get_lr_cosine_schedule(5, **args) == pytest.approx(0.5)
    assert get_lr_cosine_schedule(10, **args) == pytest.approx(1.0)
    assert get_lr_cosine_schedule(60, **args) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 2)))
    assert get_lr_cosine_schedule(110, **args) == pytest.approx(0.1)
    assert get_lr_cosine_schedule(500, **args) == pytest.approx(0.1)


def test_get_batch_windows_are_consecutive(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    memmap = np.memmap(path, dtype=np.uint16, mode="r")
    x, y = get_batch(memmap, 6, 31, "cpu")
    assert x.shape == y.shape == (6, 31) and x.dtype == torch.int64
    torch.testing.assert_close(y, x + 1)
    assert torch.all(x[:, 1:] - x[:, :-1] == 1)
    with pytest.raises(ValueError, match="too short"):
        get_batch(tokens[:10], 2, 31)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_])
def test_get_batch_refuses_a_dataset_that_is_not_integer_tokens(dtype):
    with pytest.raises(TypeError, match=f"dataset must hold integer token ids, got dtype {np.dtype(dtype)}"):
        get_batch(np.arange(100).astype(dtype), 2, 7)


def _train_steps(model, opt, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 503, (2, 33), generator=gen)
        opt.zero_grad()
        loss = cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        opt.step()
    return loss.item()


def test_checkpoint_round_trip_continues_identically(tmp_path):
    torch.manual_seed(0)
    model = build_model("tiny")
    opt = AdamW(model.parameters(), lr=1e-3)
    _train_steps(model, opt, 3, seed=1)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(model, opt, 3, path)
    expected = _train_steps(model, opt, 4, seed=2)

    torch.manual_seed(123)
    restored = build_model("tiny")
    restored_opt = AdamW(restored.parameters(), lr=1e-3)
    assert load_checkpoint(path, restored, restored_opt) == 3
    assert _train_steps(restored, restored_opt, 4, seed=2) == expected
    for p, q in zip(model.parameters(), restored.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert [f.name for f in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left behind


def test_checkpoint_to_file_object():
    model = build_model("tiny")
    opt = AdamW(model.parameters())
    buf = io.BytesIO()
    save_checkpoint(model, opt, 7, buf)
    buf.seek(0)
    assert load_checkpoint(buf, build_model("tiny"), AdamW(build_model("tiny").parameters())) == 7


def _tiny_with_optimizer():
    model = build_model("tiny")
    return model, AdamW(model.parameters())


def test_loading_an_empty_truncated_or_foreign_file_names_it(tmp_path):
    model, opt = _tiny_with_optimizer()
    path = tmp_path / "ckpt.pt"
    path.touch()
    with pytest.raises(ValueError, match=rf"{path} is not a complete checkpoint \(0 bytes, empty or trunc"):
        load_checkpoint(path, model, opt)
    save_checkpoint(model, opt, 5, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{path} is not a complete checkpoint \(\d+ bytes"):
        load_checkpoint(path, model, opt)
    torch.save({"model": model.state_dict()}, path)
    with pytest.raises(
        ValueError, match=r"is not a training checkpoint: it lacks \['iteration', 'optimizer'\]"
    ):
        load_checkpoint(path, model, opt)


def test_a_failed_save_removes_its_temporary_and_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    model, opt = _tiny_with_optimizer()
    path = tmp_path / "ckpt.pt"
    save_checkpoint(model, opt, 1, path)

    def full_disk(obj, f):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(model, opt, 2, path)
    monkeypatch.undo()
    assert [f.name for f in tmp_path.iterdir()] == ["ckpt.pt"]
    assert load_checkpoint(path, *_tiny_with_optimizer()) == 1


# A save killed (SIGKILL) in the middle of writing: no Python cleanup runs, the temporary stays behind.
KILLED_SAVE = textwrap.dedent("""
    import os, signal, sys
    import torch
    from cs336_basics import AdamW, build_model, save_checkpoint

    def killed_while_writing(obj, f):
        f.write(b"partial")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = killed_while_writing
    model = build_model("tiny")
    save_checkpoint(model, AdamW(model.parameters()), 1, sys.argv[1])
""")


@pytest.mark.skipif(not hasattr(os, "kill") or sys.platform == "win32", reason="needs POSIX signals")
def test_the_next_save_removes_what_a_killed_save_left(tmp_path):
    path, other = tmp_path / "ckpt.pt", tmp_path / "other.pt"
    for target in (path, other):
        done = subprocess.run(
            [sys.executable, "-c", KILLED_SAVE, str(target)], capture_output=True, timeout=120
        )
        assert done.returncode == -9, done.stderr.decode()[-2000:]
    litter = sorted(f.name for f in tmp_path.iterdir())
    assert len(litter) == 2 and all(n.startswith((".ckpt.pt.", ".other.pt.")) for n in litter), litter

    model, opt = _tiny_with_optimizer()
    save_checkpoint(model, opt, 3, path)
    left = sorted(f.name for f in tmp_path.iterdir())
    assert left[0].startswith(".other.pt.") and left[1:] == ["ckpt.pt"], left  # other targets' files kept
    assert load_checkpoint(path, *_tiny_with_optimizer()) == 3


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_counts_on_meta(name):
    config = PRESETS[name]
    model = build_model(config, device="meta")
    assert sum(p.numel() for p in model.parameters()) == config.parameter_count


def test_known_sizes():
    assert PRESETS["leaderboard-8b"].parameter_count == pytest.approx(8.13e9, rel=1e-3)
    assert PRESETS["xl"].parameter_count == pytest.approx(3.41e9, rel=1e-3)
    with pytest.raises(ValueError, match="unknown preset"):
        build_model("huge")
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        PRESETS["tiny"].with_(layers=3)
