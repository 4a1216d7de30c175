"""Sharded checkpoints saved on one world size and wrapper, loaded on another (gloo, CPU), against a
single-process run that never stopped."""

import pytest
import torch
import torch.distributed.checkpoint as dcp
from lm_cases import train_step
from parallel import FSDP, BucketedDDP, CheckpointError, ShardedOptimizer, load_sharded, save_sharded
from parallel.launch import spawn

ROWS = 12  # sequences per step, split evenly over 1 to 4 ranks
ADAMW = dict(lr=2e-2, weight_decay=0.1, betas=(0.8, 0.95))


def _reference(lm, steps):
    model = lm[0]()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    for step in range(steps):
        train_step(model, opt, step, ROWS, 0, 1)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _build(kind, lm, seed):
    if kind == "fsdp":
        model = FSDP(lm[0](seed=seed))
        return model, torch.optim.AdamW(model.parameters(), **ADAMW)
    model = BucketedDDP(lm[0](seed=seed), bucket_size_mb=1e-4)
    return model, ShardedOptimizer(model.parameters(), torch.optim.AdamW, mode="broadcast", **ADAMW)


def _full(model):
    if isinstance(model, FSDP):
        return {n: t.numpy() for n, t in model.gather_full_params().items()}
    return {n.removeprefix("module."): p.detach().numpy().copy() for n, p in model.named_parameters()}


def _train_and_save(rank, world_size, kind, lm, path, steps):
    model, opt = _build(kind, lm, seed=0)
    for step in range(steps):
        train_step(model, opt, step, ROWS, rank, world_size)
    save_sharded(path, model, opt, extra={"step": steps, "rank": rank, "rng": torch.get_rng_state()})


def _load_and_continue(rank, world_size, kind, lm, path, step):
    model, opt = _build(kind, lm, seed=7)  # other initial values: everything must come from the file
    opt.param_groups[0]["lr"] = 1.0
    extra = load_sharded(path, model, opt)
    train_step(model, opt, step, ROWS, rank, world_size)
    return {k: v for k, v in extra.items() if k != "rng"}, _full(model)


def _assert_close(full, reference):
    assert sorted(full) == sorted(reference)
    for name, value in full.items():  # AdamW near zero gradients: summation order moves weights ~1% of lr
        torch.testing.assert_close(torch.from_numpy(value), reference[name], atol=2e-4, rtol=0, msg=name)


@pytest.mark.parametrize(("kind", "saved_on", "loaded_on"), [("fsdp", 2, 4), ("zero", 2, 3)])
def test_saved_on_n_ranks_resumes_on_m_ranks_and_in_plain_process(tmp_path, lm, kind, saved_on, loaded_on):
    path = tmp_path / "ckpt"
    spawn(_train_and_save, saved_on, kind, lm, path, 2, timeout=120)
    for rank in range(saved_on):  # every rank wrote its own part
        assert sum(f.stat().st_size for f in path.glob(f"__{rank}_*.distcp")) > 1000, rank
    reference = _reference(lm, 3)
    resumed = spawn(_load_and_continue, loaded_on, kind, lm, path, 2, timeout=120)
    for rank, (extra, full) in enumerate(resumed):
        assert extra == {"step": 2, "rank": rank if rank < saved_on else 0}
        _assert_close(full, reference)
    plain = lm[0](seed=3)  # no process group at all: a plain module and optimizer
    opt = torch.optim.AdamW(plain.parameters(), lr=1.0)
    assert load_sharded(path, plain, opt)["step"] == 2
    assert opt.param_groups[0]["lr"] == ADAMW["lr"]
    train_step(plain, opt, 2, ROWS, 0, 1)
    _assert_close({n: p.detach().numpy() for n, p in plain.named_parameters()}, reference)


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot be pickled")


def _failing_save(rank, world_size, lm, path, where):
    model, opt = _build("fsdp", lm, seed=0)
    train_step(model, opt, 0, ROWS, rank, world_size)
    extra = {"unpicklable": _Unpicklable()} if rank == 1 and where == "pickle" else {}
    if rank == 1 and where == "write":  # the disk fails under one rank in the middle of the save
        def broken(self, plan, planner):
            raise OSError("disk full")
        dcp.FileSystemWriter.write_data = broken
    try:
        save_sharded(path, model, opt, extra=extra)
    except Exception as err:  # every rank learns that the save failed
        return str(err)
    return "saved"


@pytest.mark.parametrize("where", ["pickle", "write"])
def test_failed_save_leaves_nothing_and_stale_partial_is_cleaned(tmp_path, lm, where):
    path = tmp_path / "ckpt"
    errors = spawn(_failing_save, 2, lm, path, where, timeout=60)
    assert "cannot be pickled" in errors[1] if where == "pickle" else "disk full" in errors[1]
    assert "saved" not in errors
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="not a complete sharded checkpoint"):
        load_sharded(path, lm[0]())
    (tmp_path / "ckpt.partial").mkdir()  # what a killed save leaves
    (tmp_path / "ckpt.partial" / "__0_0.distcp").write_bytes(b"half")
    with pytest.raises(FileNotFoundError):
        load_sharded(tmp_path / "ckpt.partial", lm[0]())
    model = lm[0]()
    save_sharded(path, model)
    save_sharded(path, model, extra={"again": True})  # overwriting a checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    other = lm[0](seed=1)
    assert load_sharded(path, other) == {"again": True}
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_bad_paths_and_mismatched_models_are_named(tmp_path, lm):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a sharded checkpoint"):
        save_sharded(tmp_path / "file", lm[0]())
    with pytest.raises(TypeError, match="extra must be a dict"):
        save_sharded(tmp_path / "c", lm[0](), extra=[1])
    save_sharded(tmp_path / "c", lm[0]())
    wider = torch.nn.Sequential(torch.nn.Linear(3, 5))
    with pytest.raises(CheckpointError, match=r"missing keys \['model/0\.weight', 'model/0\.bias'\].*unexp"):
        load_sharded(tmp_path / "c", wider)
    other = lm[0]()
    other.up = torch.nn.Linear(12, 20)
    with pytest.raises(CheckpointError, match=r"'model/up\.weight' has 228 elements, the model's 240"):
        load_sharded(tmp_path / "c", other)
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        load_sharded(tmp_path / "c", lm[0](), torch.optim.SGD(lm[0]().parameters(), lr=1.0))


def _save_to_own_folder(rank, world_size, lm, folder):
    try:
        save_sharded(folder / f"rank{rank}", lm[0]())
    except ValueError as err:
        return str(err)
    return "saved"


def test_ranks_naming_different_folders_are_refused_before_writing(tmp_path, lm):
    errors = spawn(_save_to_own_folder, 2, lm, tmp_path, timeout=60)
    named = f"rank 0: {str(tmp_path / 'rank0')!r}, rank 1: {str(tmp_path / 'rank1')!r}"
    assert errors == [f"save_sharded needs the same path on every rank, got {named}"] * 2
    assert list(tmp_path.iterdir()) == []


def test_optimizer_state_loads_exactly_into_fresh_buffers(tmp_path, lm):
    """Every state tensor comes back bit for bit (the buffers it is read into start uninitialized)."""
    model = lm[0](seed=0)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    for step in range(2):
        train_step(model, opt, step, ROWS, 0, 1)
    save_sharded(tmp_path / "ckpt", model, opt)
    fresh = lm[0](seed=5)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), **ADAMW)
    load_sharded(tmp_path / "ckpt", fresh, fresh_opt)
    saved, loaded = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert sorted(saved) == sorted(loaded) and saved
    for index, state in saved.items():
        for key, value in state.items():
            assert torch.equal(loaded[index][key], value), (index, key)
