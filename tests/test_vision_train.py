"""Runs on image data: tiny-vl trains, the training forward sees the rollout's pixel inputs."""

from __future__ import annotations

import hashlib

import pytest
import torch

pytest.importorskip("PIL")

from transformers import Idefics3ForConditionalGeneration

import gspo.models.vision as vision
from gspo.compose.train import train
from gspo.config import TrainConfig, build
from gspo.models.model_io import load_model
from gspo.models.vision import is_vision_model


def _digest(t: torch.Tensor) -> str:
    return hashlib.blake2b(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


@pytest.fixture
def seen(monkeypatch):
    """Every image (one [I, 3, H, W] entry per row) the model's forward gets, by mode: False
    for the engine's prefill (eval mode), True for the update's forwards (train mode; rows
    with zero advantage run there without grad)."""
    record: dict[bool, list[str]] = {False: [], True: []}
    original = Idefics3ForConditionalGeneration.forward

    def forward(self, *args, pixel_values=None, **kwargs):
        if pixel_values is not None:
            record[self.training] += [_digest(row) for row in pixel_values]
        return original(self, *args, pixel_values=pixel_values, **kwargs)

    # The update's forwards merge image features themselves (vision.image_inputs, once per
    # prompt): their images are the pixel entries of the rows' prompts.
    inputs = vision.image_inputs

    def image_inputs(model, input_ids, pixels, prompt_index):
        record[model.training] += [_digest(pixels.values[i]) for i in prompt_index.tolist()]
        return inputs(model, input_ids, pixels, prompt_index)

    monkeypatch.setattr(Idefics3ForConditionalGeneration, "forward", forward)
    monkeypatch.setattr(vision, "image_inputs", image_inputs)
    return record


@pytest.mark.slow
def test_two_step_train_on_images_feeds_rollout_pixels_to_training(seen, tmp_path):
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides={
            "model": "tiny-vl",
            "task": "shapes",
            "device": "cpu",
            "threads": 1,
            "output_dir": str(tmp_path / "run"),
            "max_new_tokens": 6,
            "checkpoint_every": 1,
        },
    )
    result = train(cfg)
    assert len([r for r in result.history if "reward/mean" in r]) == 2
    # The training forward took exactly the pixel inputs the engine sampled from:
    # every row's images are its prompt's, and every prompt sampled is trained on.
    assert seen[True] and seen[False]
    assert set(seen[True]) == set(seen[False])
    # One prefill per prompt: its group shares it (prompts_per_step 2 x steps 2).
    assert len(seen[False]) == 4
    final = load_model(tmp_path / "run" / "final")
    assert is_vision_model(final)
    # Checkpoints and final/ carry the processor (image processor and chat template).
    saved = [tmp_path / "run" / "final", *(tmp_path / "run" / "checkpoints").glob("step_*")]
    assert len(saved) >= 2 and all((p / "processor_config.json").is_file() for p in saved)
