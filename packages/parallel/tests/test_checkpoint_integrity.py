"""Damaged sharded checkpoints: flipped bytes and bits, truncated or missing files, mixed saves, checkpoints
written before checksums or with format 1's CRC-32; and mismatched models and optimizers, each named in the
error."""

import json
import warnings
import zlib

import numpy as np
import pytest
import torch
from lm_cases import train_step
from parallel import (
    CheckpointError,
    CorruptCheckpointError,
    load_sharded,
    read_extra,
    save_sharded,
    verify_sharded,
)
from parallel.checkpoint_pickle import read_dcp_metadata
from parallel.launch import spawn

ADAMW = dict(lr=2e-2, weight_decay=0.1, betas=(0.8, 0.95))


def _trained(lm, seed=0):
    model = lm[0](seed=seed)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    train_step(model, opt, 0, 6, 0, 1)
    return model, opt


def _saved(tmp_path, lm):
    model, opt = _trained(lm)
    path = tmp_path / "ckpt"
    save_sharded(path, model, opt, extra={"step": 1, "rng": np.random.get_state()})
    return path, model


def _file_of(path, key):
    """The file and byte range holding ``key`` (read through the restricted unpickler)."""
    metadata = read_dcp_metadata((path / ".metadata").read_bytes(), ".metadata")
    info = next(v for k, v in metadata.storage_data.items() if k.fqn == key)
    return path / info.relative_path, info.offset, info.length


def _flip(file, positions, mask=0xFF):
    data = bytearray(file.read_bytes())
    for i in positions:
        data[i] ^= mask
    file.write_bytes(bytes(data))


def _fresh(lm):
    model = lm[0](seed=5)
    return model, torch.optim.AdamW(model.parameters(), lr=1.0)


@pytest.mark.parametrize(("count", "mask"), [(100, 0xFF), (10, 0x01)])
def test_flipped_bytes_and_low_bits_in_a_shard_name_the_file_and_key(tmp_path, lm, count, mask):
    path, saved = _saved(tmp_path, lm)
    file, _, _ = _file_of(path, "model/embed.weight")
    start = file.read_bytes().index(saved.embed.weight.detach().numpy().tobytes())  # the weights themselves
    rng = np.random.default_rng(count)
    _flip(file, start + rng.choice(saved.embed.weight.numel() * 4, count, replace=False), mask)
    with pytest.raises(CorruptCheckpointError, match=rf"{file.name} \(item 'model/embed\.weight'.*checksum"):
        load_sharded(path, *_fresh(lm))
    with pytest.raises(CorruptCheckpointError, match=rf"{file.name}.*model/embed\.weight"):
        verify_sharded(path)
    model, opt = _fresh(lm)
    load_sharded(path, model, opt, verify=False)  # the opt-out reads the changed weights
    assert 0 < int((model.embed.weight != saved.embed.weight).sum()) <= count


def test_flipped_bytes_in_extra_give_a_clear_error_with_or_without_checksums(tmp_path, lm):
    path, _ = _saved(tmp_path, lm)
    file, offset, length = _file_of(path, "extra/rank0")
    _flip(file, range(offset + 40, offset + length - 40, 7))
    with pytest.raises(CorruptCheckpointError, match=rf"{file.name} \(item 'extra/rank0'.*checksum"):
        read_extra(path)
    unverified = rf"{file.name} \(item 'extra/rank0'.*cannot be unpickled"
    with pytest.raises(CorruptCheckpointError, match=unverified):
        read_extra(path, verify=False)
    with pytest.raises(CorruptCheckpointError, match=unverified):
        load_sharded(path, *_fresh(lm), verify=False)


def test_truncated_missing_and_mixed_files_are_named(tmp_path, lm):
    path, _ = _saved(tmp_path, lm)
    file, _, _ = _file_of(path, "optim/up.weight/exp_avg")
    data = file.read_bytes()
    file.write_bytes(data[:-10])
    with pytest.raises(CorruptCheckpointError, match=rf"{file} has {len(data) - 10} bytes, the manifest says "
                                                     rf"{len(data)} \(truncated\)"):
        load_sharded(path, *_fresh(lm))
    file.unlink()
    with pytest.raises(CorruptCheckpointError, match=rf"{file} is missing"):
        load_sharded(path, *_fresh(lm))
    file.write_bytes(data)
    other = tmp_path / "other"  # another run saving into the same folder: its shards mixed with ours
    save_sharded(other, *_trained(lm, seed=1), extra={"step": 1})
    (path / file.name).write_bytes((other / file.name).read_bytes())
    with pytest.raises(CorruptCheckpointError, match=rf"{file.name} \(item .* does not match its checksum"):
        load_sharded(path, *_fresh(lm))
    (path / ".metadata").write_bytes((other / ".metadata").read_bytes())
    with pytest.raises(CorruptCheckpointError, match=r"\.metadata does not match its checksum"):
        load_sharded(path, *_fresh(lm))
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match=r"manifest\.json is not a checkpoint manifest"):
        load_sharded(path, *_fresh(lm))


def test_checkpoint_without_manifest_loads_with_a_warning_and_truncation_is_still_named(tmp_path, lm):
    path, saved = _saved(tmp_path, lm)
    (path / "manifest.json").unlink()  # what save_sharded wrote before checksums existed
    model, opt = _fresh(lm)
    with pytest.warns(UserWarning, match="no manifest.json .* cannot be verified"):
        extra = load_sharded(path, model, opt)
    assert extra["step"] == 1 and extra["rng"][0] == "MT19937" and extra["rng"][1].shape == (624,)
    for a, b in zip(saved.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(CheckpointError, match="cannot be verified"):
        verify_sharded(path)
    file, offset, length = _file_of(path, "model/down.weight")
    file.write_bytes(file.read_bytes()[: offset + length // 2])
    with warnings.catch_warnings(), pytest.raises(CorruptCheckpointError, match=rf"{file} is truncated"):
        warnings.simplefilter("ignore")
        load_sharded(path, *_fresh(lm))


def test_shapes_dtypes_keys_and_optimizers_that_do_not_fit_are_refused(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    save_sharded(tmp_path / "c", model, opt)
    transposed = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(4, 3))
    transposed[0].register_parameter("bias", torch.nn.Parameter(torch.zeros(4)))
    with pytest.raises(CheckpointError, match=r"'model/0\.weight' has shape \(4, 6\), the model's \(6, 4\)"):
        load_sharded(tmp_path / "c", transposed)
    sgd = torch.optim.SGD(model.parameters(), lr=0.123, momentum=0.9)
    with pytest.raises(CheckpointError, match=r"optimizer is torch\.optim\.adamw\.AdamW, this one .*\.SGD"):
        load_sharded(tmp_path / "c", model, sgd)
    assert sgd.param_groups[0]["lr"] == 0.123 and "betas" not in sgd.param_groups[0]
    half = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 3)).to(torch.bfloat16)
    with pytest.raises(CheckpointError, match=r"'model/0\.weight' is float32, the model's bfloat16"):
        load_sharded(tmp_path / "c", half)
    bigger = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match=r"missing keys \['model/2\.weight', 'model/2\.bias'\]"):
        load_sharded(tmp_path / "c", bigger)
    load_sharded(tmp_path / "c", bigger, strict=False)  # the layers both have; the new one keeps its values
    assert torch.equal(bigger[1].weight, model[1].weight)
    smaller = torch.nn.Sequential(torch.nn.Linear(6, 4))
    with pytest.raises(CheckpointError, match=r"unexpected keys \['model/1\.weight', 'model/1\.bias', "
                                              r"'optim/1\.weight/exp_avg'"):
        load_sharded(tmp_path / "c", smaller, torch.optim.AdamW(smaller.parameters()))
    two_groups = torch.optim.AdamW([{"params": model[1].parameters()}, {"params": model[0].parameters()}])
    with pytest.raises(CheckpointError, match="optimizer has 2 param_groups, the checkpoint's 1"):
        load_sharded(tmp_path / "c", model, two_groups)
    renamed = torch.optim.AdamW(model.parameters(), lr=0.5)
    renamed.param_groups[0]["note"] = "mine"
    with pytest.raises(CheckpointError, match=r"hyper-parameters \['note'\] are not in the checkpoint"):
        load_sharded(tmp_path / "c", model, renamed)
    load_sharded(tmp_path / "c", model, renamed, strict=False)
    assert renamed.param_groups[0]["lr"] == 0.01 and renamed.param_groups[0]["note"] == "mine"


def test_a_parameter_in_another_group_is_named(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    decay, plain = [model[0].weight], [model[0].bias, *model[1].parameters()]
    opt = torch.optim.AdamW([{"params": decay}, {"params": plain, "weight_decay": 0.0}])
    save_sharded(tmp_path / "c", model, opt)
    swapped = torch.optim.AdamW([{"params": plain, "weight_decay": 0.0}, {"params": decay}])
    with pytest.raises(CheckpointError, match=r"parameter '0\.bias' is in param_groups\[0\] of this "
                                              r"optimizer, in param_groups\[1\] of the checkpoint's"):
        load_sharded(tmp_path / "c", model, swapped)


def _load_damaged(rank, world_size, lm, path):
    model, opt = _fresh(lm)
    try:
        load_sharded(path, model, opt)
    except CheckpointError as err:
        return type(err).__name__, str(err)
    return "loaded", ""


def test_every_rank_raises_for_a_shard_only_one_rank_reads_and_none_hangs(tmp_path, lm):
    path, _ = _saved(tmp_path, lm)
    file, offset, length = _file_of(path, "model/up.weight")
    _flip(file, [offset + length - 5])
    results = spawn(_load_damaged, 2, lm, path, timeout=60)
    for kind, message in results:  # DCP spreads the reads; whichever rank read it, all raise
        assert kind == "CorruptCheckpointError" and file.name in message and "model/up.weight" in message
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["shapes"]["model/up.weight"] == [19, 12]


def _as_format_1(path):
    """Rewrite the manifest as format 1 wrote it: a CRC-32 of each item's bytes instead of its sum64."""
    manifest = json.loads((path / "manifest.json").read_text())
    for name, rows in manifest["items"].items():
        data = (path / name).read_bytes()
        for row in rows:
            row[2] = zlib.crc32(data[row[0]:row[0] + row[1]])
    manifest["format"] = "parallel.checkpoint/1"
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_a_format_1_checkpoint_loads_checked_by_crc32_and_an_unknown_format_is_refused(tmp_path, lm):
    path, saved = _saved(tmp_path, lm)
    assert json.loads((path / "manifest.json").read_text())["format"] == "parallel.checkpoint/2"
    _as_format_1(path)
    model, opt = _fresh(lm)
    assert load_sharded(path, model, opt)["step"] == 1
    for a, b in zip(saved.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert verify_sharded(path) > 0
    file, offset, length = _file_of(path, "model/up.weight")
    _flip(file, [offset + length // 2])
    with pytest.raises(CorruptCheckpointError, match=rf"{file.name} \(item 'model/up\.weight'.*checksum "
                                                     r"\(crc32 [0-9a-f]{8}, the manifest says"):
        load_sharded(path, *_fresh(lm))
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "format": "parallel.checkpoint/9"}))
    with pytest.raises(CorruptCheckpointError, match=r"manifest\.json is not a checkpoint manifest .*"
                                                     r"'parallel\.checkpoint/9', this version reads"):
        load_sharded(path, *_fresh(lm))
