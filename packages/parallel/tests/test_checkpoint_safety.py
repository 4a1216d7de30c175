"""Loading a sharded checkpoint never runs code stored in it: an object whose ``__reduce__`` would create a
file, planted in each pickled place (extra, optimizer state, param groups, DCP's .metadata), is refused
naming the file and the type, and the file is never created."""

import io
import json
import pickle
import zlib

import numpy as np
import pytest
import torch
from parallel import UnsafeCheckpointError, load_sharded, read_extra, save_sharded
from parallel import checkpoint as checkpoint_module
from parallel.checkpoint_pickle import read_dcp_metadata


class _Planted:
    """Unpickling this calls ``open(marker, "w")``: the file appears if the loader runs code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _unchecked_dumps(obj, what, numpy_arrays=False):
    """What a writer without save_sharded's check (an older or a hostile one) would store."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    return model, opt


@pytest.mark.parametrize("place", ["extra", "optimizer state", "param groups"])
def test_planted_object_in_our_pickles_is_refused_without_running(tmp_path, monkeypatch, place):
    marker = tmp_path / "pwned"
    model, opt = _model_and_optimizer()
    extra = {"step": 3}
    if place == "extra":
        extra["payload"] = _Planted(marker)
    elif place == "optimizer state":
        opt.state[model[0].weight]["payload"] = _Planted(marker)
    else:
        opt.param_groups[0]["payload"] = _Planted(marker)
    with pytest.raises(TypeError, match=r"io\.open, which load_sharded refuses"):
        save_sharded(tmp_path / "refused", model, opt, extra=extra)  # our own save never writes one
    assert not (tmp_path / "refused").exists() and not (tmp_path / "refused.partial").exists()
    monkeypatch.setattr(checkpoint_module, "dumps", _unchecked_dumps)
    save_sharded(tmp_path / "c", model, opt, extra=extra)
    monkeypatch.undo()
    assert not marker.exists()
    key = {"extra": "extra/rank0", "optimizer state": "optim/0.weight/other",
           "param groups": "optim/param_groups"}[place]
    fresh, fresh_opt = _model_and_optimizer()
    with pytest.raises(UnsafeCheckpointError, match=rf"__\d+_\d+\.distcp \(item '{key}'.* holds io\.open"):
        load_sharded(tmp_path / "c", fresh, fresh_opt)
    if place == "extra":
        with pytest.raises(UnsafeCheckpointError, match=r"io\.open"):
            read_extra(tmp_path / "c")
    assert not marker.exists()


@pytest.mark.parametrize("with_manifest", [True, False])
def test_planted_object_in_dcp_metadata_is_refused_without_running(tmp_path, with_manifest):
    marker = tmp_path / "pwned"
    model, opt = _model_and_optimizer()
    save_sharded(tmp_path / "c", model, opt)
    path = tmp_path / "c" / ".metadata"
    metadata = read_dcp_metadata(path.read_bytes(), str(path))
    metadata.planner_data = _Planted(marker)
    forged = pickle.dumps(metadata)
    path.write_bytes(forged)
    manifest = tmp_path / "c" / "manifest.json"
    if with_manifest:  # a forger rewrites the checksum too: the unpickler must still refuse
        fields = json.loads(manifest.read_text())
        fields["metadata"] = {"bytes": len(forged), "crc32": zlib.crc32(forged)}
        manifest.write_text(json.dumps(fields))
    else:
        manifest.unlink()
    with pytest.raises(UnsafeCheckpointError, match=r"c/\.metadata holds io\.open, which is not one of"):
        load_sharded(tmp_path / "c", *_model_and_optimizer())
    assert not marker.exists()


def test_what_the_app_saves_round_trips(tmp_path):
    """numpy's RNG state, torch's, a loss history and a recipe dict: the types allowed in ``extra``."""
    model, opt = _model_and_optimizer()
    rng = [(np.random.get_state(), torch.get_rng_state()) for _ in range(2)]
    extra = {"step": 7, "rng_states": rng, "history": [{"step": 1, "train_loss": float("nan"), "lr": 1e-3}],
             "recipe": {"name": "tiny", "context_length": 33, "betas": (0.9, 0.95), "seed": None}}
    save_sharded(tmp_path / "c", model, opt, extra=extra)
    loaded = load_sharded(tmp_path / "c", *_model_and_optimizer())
    assert loaded["recipe"] == extra["recipe"] and loaded["step"] == 7
    assert np.isnan(loaded["history"][0]["train_loss"])
    numpy_state, torch_state = loaded["rng_states"][1]
    assert numpy_state[0] == "MT19937" and np.array_equal(numpy_state[1], rng[1][0][1])
    assert torch.equal(torch_state, rng[1][1])
    assert read_extra(tmp_path / "c", rank=1)["recipe"] == extra["recipe"]  # rank 0's for a missing rank


def test_an_extra_that_cannot_be_pickled_is_named(tmp_path):
    model, opt = _model_and_optimizer()
    refused = r"^extra cannot be pickled \((AttributeError|PicklingError): .*local"
    with pytest.raises(TypeError, match=refused):
        save_sharded(tmp_path / "c", model, opt, extra={"schedule": lambda step: step})
    assert not (tmp_path / "c").exists() and not (tmp_path / "c.partial").exists()
