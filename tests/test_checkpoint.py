"""Tests for gspo.backend.checkpoint: round trip, crash safety, rotation and the ``latest`` pointer."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from gspo.backend import checkpoint as ckpt
from gspo.backend.base import CheckpointTarget
from gspo.backend.update import lr_lambda
from gspo.core.checkpoint_paths import latest_checkpoint, list_checkpoints
from gspo.models.char_tokenizer import build_char_tokenizer
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model


def make_parts(seed: int = 0):
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    if seed:
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(5))
    return model, tok, opt, sched


def train_a_little(model, tok, opt, sched, steps: int = 3) -> None:
    ids = torch.tensor([tok("12+34=")["input_ids"]] * 2)
    mask = torch.ones_like(ids)
    comp = torch.tensor([tok("46", add_special_tokens=False)["input_ids"]] * 2)
    cmask = torch.ones_like(comp)
    model.train()
    for _ in range(steps):
        lp, _ = token_logprobs(model, ids, mask, comp, cmask)
        (-lp.sum()).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


def save(out, step, model, tok, opt, sched, keep=2, extra=None):
    target = CheckpointTarget(out, tok, {"steps": 10}, keep)
    return ckpt.save_checkpoint(target, step, model, opt, sched, extra)


def assert_nested_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_nested_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_nested_equal(x, y)
    else:
        assert a == b


def test_round_trip_model_optimizer_scheduler_rng(tmp_path):
    model, tok, opt, sched = make_parts()
    train_a_little(model, tok, opt, sched)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    path = save(tmp_path, 3, model, tok, opt, sched, extra={"note": "x"})
    assert path == tmp_path / "checkpoints" / "step_000003"
    expected_draws = (random.random(), float(np.random.rand()), torch.rand(3))
    state_model = {k: v.clone() for k, v in model.state_dict().items()}
    state_opt = opt.state_dict()
    state_sched = sched.state_dict()

    model2, _, opt2, sched2 = make_parts(seed=7)
    assert not torch.equal(model2.model.embed_tokens.weight, model.model.embed_tokens.weight)
    random.seed(99)
    state = ckpt.restore(path, model=model2, optimizer=opt2, scheduler=sched2)
    assert state["step"] == 3 and state["config"] == {"steps": 10} and state["note"] == "x"

    assert_nested_equal(state_model, model2.state_dict())
    # Tied embeddings are tied again after loading (one tensor, not two copies).
    assert model2.lm_head.weight.data_ptr() == model2.model.embed_tokens.weight.data_ptr()
    assert_nested_equal(state_opt, opt2.state_dict())
    assert opt2.state_dict()["state"][0]["step"] == 3
    assert state_sched == sched2.state_dict()
    assert sched2.get_last_lr() == sched.get_last_lr()
    # RNG streams continue exactly where they were at save time.
    assert random.random() == expected_draws[0]
    assert float(np.random.rand()) == expected_draws[1]
    assert torch.equal(torch.rand(3), expected_draws[2])

    # Training on from either copy gives the same weights: the optimizer holds the restored params.
    train_a_little(model, tok, opt, sched, steps=2)
    train_a_little(model2, tok, opt2, sched2, steps=2)
    assert_nested_equal(model.state_dict(), model2.state_dict())


def test_checkpoint_folder_contents(tmp_path):
    model, tok, opt, sched = make_parts()
    path = save(tmp_path, 1, model, tok, opt, sched)
    names = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "rng.pt"} <= names
    assert "state.json" in names and "tokenizer.json" in names
    assert json.loads((path / "state.json").read_text())["step"] == 1


def test_restore_into_a_different_model_fails(tmp_path):
    model, tok, opt, sched = make_parts()
    path = save(tmp_path, 1, model, tok, opt, sched)
    other = build_tiny_model(len(tok), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1)
    other_opt = torch.optim.AdamW(other.parameters())
    other_sched = torch.optim.lr_scheduler.LambdaLR(other_opt, lr_lambda(0))
    with pytest.raises(RuntimeError, match="does not fit the model"):
        ckpt.restore(path, model=other, optimizer=other_opt, scheduler=other_sched)


def test_leftover_temporary_folder_is_ignored(tmp_path):
    model, tok, opt, sched = make_parts()
    save(tmp_path, 2, model, tok, opt, sched)
    root = tmp_path / "checkpoints"
    # A crash while step 4 was written: a temporary folder with partial files, even state.json.
    tmp = root / ".tmp-step_000004-xyz"
    tmp.mkdir()
    (tmp / "config.json").write_text("{}")
    (tmp / "model.safetensors").write_bytes(b"\x00" * 10)
    (tmp / "state.json").write_text('{"step": 4}')
    # And a real-looking folder without state.json (written by something else, or truncated).
    (root / "step_000005").mkdir()
    (root / "step_000005" / "model.safetensors").write_bytes(b"")

    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002"]
    assert latest_checkpoint(tmp_path) == root / "step_000002"
    # A later save still works and becomes the latest.
    save(tmp_path, 6, model, tok, opt, sched)
    assert latest_checkpoint(tmp_path).name == "step_000006"


def test_a_failed_write_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    model, tok, opt, sched = make_parts()
    save(tmp_path, 2, model, tok, opt, sched)
    real_save = torch.save

    def crash(obj, f, *a, **kw):
        if str(f).endswith("scheduler.pt"):
            raise OSError("disk full")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path, 4, model, tok, opt, sched)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002"]
    assert (root / "latest").read_text() == "step_000002\n"
    assert latest_checkpoint(tmp_path).name == "step_000002"


def test_rotation_keeps_the_newest_and_latest_points_at_it(tmp_path):
    model, tok, opt, sched = make_parts()
    for step in (1, 2, 3, 10, 11):
        save(tmp_path, step, model, tok, opt, sched, keep=2)
        assert (tmp_path / "checkpoints" / "latest").read_text() == f"step_{step:06d}\n"
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step_000010", "step_000011"]  # numeric order, not just string order
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000010", "step_000011"]

    save(tmp_path, 12, model, tok, opt, sched, keep=3)
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step_000010",
        "step_000011",
        "step_000012",
    ]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    model, tok, opt, sched = make_parts()
    save(tmp_path, 3, model, tok, opt, sched)
    train_a_little(model, tok, opt, sched, steps=1)
    path = save(tmp_path, 3, model, tok, opt, sched)
    model2, _, opt2, sched2 = make_parts(seed=5)
    ckpt.restore(path, model=model2, optimizer=opt2, scheduler=sched2)
    assert_nested_equal(model.state_dict(), model2.state_dict())
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000003"]


def test_no_checkpoint_yet(tmp_path):
    assert list_checkpoints(tmp_path) == []
    assert latest_checkpoint(tmp_path) is None
