"""Qwen2.5-VL policies: the tiny random-init ``tiny-qwen-vl`` model, its processor, pixel inputs
and M-RoPE positions.

Qwen2.5-VL's text model rotates queries and keys by 3-D positions (temporal, height, width;
"M-RoPE"): a text token has the same index on all three axes, an image token the row and column
of its 2x2-merged patch, offset by the text before it, and the text after an image continues
from the largest index of the image + 1. A prompt's positions therefore run ``delta`` ahead of
(or behind) its token count, and the decode must continue from there. :func:`mrope_positions`
computes them with the model's own ``get_rope_index`` over the real (unmasked) tokens of
left-padded rows, and returns each row's ``delta`` (``rope_deltas`` in transformers): the
torch engine's decode feeds token ``t`` of a row at position ``text position + delta`` on all
three axes, and ``token_logprobs`` scores prompt + response in one forward with the positions
:func:`mrope_positions` gives for the whole sequence, which are the same numbers.

The processor is this module's :class:`QwenVLProcessor` (the image processor plus the
tokenizer), not transformers' ``Qwen2_5_VLProcessor``: that one requires a video processor,
which needs torchvision. Each ``<image>`` placeholder of a prompt becomes
``<|vision_start|><|image_pad|>*k<|vision_end|>`` with k = (h / 28) * (w / 28) for an image
resized to h x w (14-pixel patches, 2x2 merge).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .char_tokenizer import PAD_ID, build_char_tokenizer
from .tiny_model import seeded_model, tiny_text_config

__all__ = [
    "MROPE_TYPES",
    "QwenPixelInputs",
    "QwenVLProcessor",
    "build_tiny_qwen_vl",
    "mrope_positions",
    "uses_mrope",
]

MROPE_TYPES = {"qwen2_5_vl"}
"""Model types whose text positions are M-RoPE's 3-D ones (what :func:`mrope_positions` does)."""

_QWEN_SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

TINY_QWEN_VL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen's ChatML layout over plain string contents; ``<|im_end|>`` ends a turn (the stop token)."""

_MIN_PIXELS = 28 * 28  # one image token at least
_MAX_PIXELS = 112 * 112  # 16 image tokens at most: tiny images, tiny sequences


def uses_mrope(model: Any) -> bool:
    """Whether ``model`` (possibly LoRA-wrapped) positions its tokens with M-RoPE."""
    return getattr(getattr(model, "config", None), "model_type", None) in MROPE_TYPES


def build_tiny_qwen_vl(
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vision_hidden: int = 32,
    seed: int = 0,
):
    """(model, tokenizer): a random-init Qwen2.5-VL over the char tokenizer plus Qwen's special
    tokens and :data:`TINY_QWEN_VL_CHAT_TEMPLATE`: a one-block vision tower (14-pixel patches,
    temporal patch 2, 2x2 merge) and a Qwen2 text model with M-RoPE. A 56x56 image becomes
    4 image tokens. Weights depend only on the arguments; the global RNG is untouched."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    head_dim = hidden_size // num_heads
    if head_dim % 2 or head_dim < 6:
        raise ValueError(f"tiny-qwen-vl needs an even head_dim >= 6, got {head_dim}")
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(_QWEN_SPECIAL)})
    tok.chat_template = TINY_QWEN_VL_CHAT_TEMPLATE
    ids = tok.convert_tokens_to_ids
    # M-RoPE splits the rotary frequencies (head_dim / 2 of them) over time, height and width
    # as Qwen2.5-VL does (16, 24, 24 of 64): a quarter to time, the rest halved.
    half = head_dim // 2
    t_part = half // 4 or 1
    h_part = (half - t_part) // 2
    section = [t_part, h_part, half - t_part - h_part]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
    text = tiny_text_config(
        len(tok), hidden_size, num_layers, num_heads, num_kv_heads, rope_parameters=rope
    )
    vision = dict(
        depth=1,
        hidden_size=vision_hidden,
        intermediate_size=2 * vision_hidden,
        num_heads=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        out_hidden_size=hidden_size,
        fullatt_block_indexes=[0],
    )
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
    )
    # sdpa, as the tiny text models: engine and one-pass scoring agree in float64.
    config._attn_implementation = "sdpa"
    return seeded_model(Qwen2_5_VLForConditionalGeneration, config, seed), tok


# --------------------------------------------------------------------------------------------
# Processor and pixel inputs
# --------------------------------------------------------------------------------------------


class QwenVLProcessor:
    """Qwen2-VL's image processor (Pillow) and the tokenizer: :meth:`encode_one` expands
    each ``<image>`` into the image's tokens and makes :class:`QwenPixelInputs`."""

    start, pad, end = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"

    def __init__(self, image_processor: Any, tokenizer: Any) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer

    @classmethod
    def derived(cls, model: Any, tokenizer: Any) -> QwenVLProcessor:
        """The processor of ``model``'s vision config (patch, merge and temporal patch sizes)
        with the tiny model's pixel limits (1 to 16 image tokens per image)."""
        from transformers import Qwen2VLImageProcessorPil

        v = model.config.vision_config
        images = Qwen2VLImageProcessorPil(
            size={"shortest_edge": _MIN_PIXELS, "longest_edge": _MAX_PIXELS},
            patch_size=int(v.patch_size),
            merge_size=int(v.spatial_merge_size),
            temporal_patch_size=int(v.temporal_patch_size),
        )
        return cls(images, tokenizer)

    @classmethod
    def load(cls, path: str | Path, tokenizer: Any) -> QwenVLProcessor:
        """The image processor saved at ``path``: its ``preprocessor_config.json``, or the one
        nested in a whole processor's ``processor_config.json`` (transformers 5)."""
        from transformers import Qwen2VLImageProcessorPil

        images = Qwen2VLImageProcessorPil.from_pretrained(str(path), local_files_only=True)
        return cls(images, tokenizer)

    def save_pretrained(self, folder: str | Path) -> None:
        self.image_processor.save_pretrained(str(folder))

    def encode_one(
        self, pieces: list[str], images: list[Any], *, special: bool
    ) -> tuple[list[int], tuple[torch.Tensor, torch.Tensor]]:
        """(token ids, (patches [P, D], grids [I, 3])) of one prompt: its text split at its
        image placeholders (``pieces``, one more than ``images``, PIL images in order)."""
        merge = int(self.image_processor.merge_size) ** 2
        out = self.image_processor(images=images, return_tensors="pt")
        grid = out["image_grid_thw"]  # [I, 3] patches along time, height, width
        text = pieces[0]
        for k, piece in zip((grid.prod(-1) // merge).tolist(), pieces[1:], strict=True):
            text += self.start + self.pad * int(k) + self.end + piece
        ids = list(self.tokenizer(text, add_special_tokens=special)["input_ids"])
        return ids, (out["pixel_values"], grid)  # [sum of patches, 3 * T * 14 * 14], [I, 3]


@dataclass
class QwenPixelInputs:
    """The pixel inputs of B prompts for Qwen2.5-VL, one entry per prompt: its images' patches
    [P_i, D] (all images of the prompt, flattened as the vision tower takes them) and their
    grids [I_i, 3] (``image_grid_thw``). A text prompt has none (0 rows). Rows of a rollout
    index it by their ``prompt_index``, as :class:`gspo.models.vision.PixelInputs`."""

    patches: list[torch.Tensor]  # B x [P_i, D]
    grids: list[torch.Tensor]  # B x [I_i, 3]

    @property
    def num_prompts(self) -> int:
        return len(self.patches)

    def rows(self, prompt_index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Forward keywords for rows whose prompts are ``prompt_index`` [N]: the rows' images
        in row order (the order ``get_rope_index`` and the placeholder scatter consume them);
        none when no row has an image."""
        idx = prompt_index.tolist()
        grid = torch.cat([self.grids[i] for i in idx])  # [I, 3]
        if grid.shape[0] == 0:
            return {}
        return {
            "pixel_values": torch.cat([self.patches[i] for i in idx]),  # [sum P_i, D]
            "image_grid_thw": grid.to(self.patches[0].device),
        }

    def forward_inputs(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_index: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """The training forward's keywords for rows ``input_ids`` [N, T] of entries
        ``prompt_index`` [N] (their patches and grids), and M-RoPE positions [3, N, T] from the
        model's own rope index: the engine's prefill + decode positions (None for a 1-D model)."""
        inputs = {"input_ids": input_ids, **self.rows(prompt_index)}
        mrope = mrope_positions(model, input_ids, attention_mask, inputs)
        return inputs, None if mrope is None else mrope[0]

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> QwenPixelInputs:
        return QwenPixelInputs(
            [p.to(device=device, dtype=dtype) for p in self.patches],
            [g.to(device) for g in self.grids],
        )

    @classmethod
    def of(cls, entries: list[tuple[torch.Tensor, torch.Tensor] | None]) -> QwenPixelInputs:
        """From :meth:`QwenVLProcessor.encode_one`'s (patches, grids) per prompt, None for a
        text prompt (it gets no images); at least one entry is not None."""
        width, dtype = next((e[0].shape[1], e[0].dtype) for e in entries if e is not None)
        none = (torch.zeros((0, width), dtype=dtype), torch.zeros((0, 3), dtype=torch.long))
        full = [e if e is not None else none for e in entries]
        return cls([p for p, _ in full], [g for _, g in full])

    @classmethod
    def cat(cls, parts: list[QwenPixelInputs]) -> QwenPixelInputs:
        """The prompts of ``parts`` in order (prompt indices offset as the rollouts' are)."""
        return cls([p for x in parts for p in x.patches], [g for x in parts for g in x.grids])


# --------------------------------------------------------------------------------------------
# M-RoPE positions
# --------------------------------------------------------------------------------------------


def _rope_owner(model: torch.nn.Module) -> Any:
    # The module holding get_rope_index (Qwen2_5_VLModel), under any wrapper (LoRA).
    for m in model.modules():
        if callable(getattr(type(m), "get_rope_index", None)):
            return m
    raise ValueError(f"{type(model).__name__} has no get_rope_index for its M-RoPE positions")


def mrope_positions(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(positions [3, N, T], deltas [N]) of left-padded rows ``input_ids`` [N, T] for an M-RoPE
    model, None for any other. ``vision`` holds the rows' ``image_grid_thw`` in row order
    (:meth:`QwenPixelInputs.rows`; empty for text rows). Pads (mask 0) get position 0; the next
    token after a row's last one goes at ``real tokens + delta`` on all three axes."""
    if not uses_mrope(model):
        return None
    image = int(model.config.image_token_id)
    types = (input_ids == image).int()  # [N, T] 1 on image tokens, 0 on text
    pos, deltas = _rope_owner(model).get_rope_index(
        input_ids,
        types,
        image_grid_thw=vision.get("image_grid_thw"),
        attention_mask=attention_mask,
    )  # [3, N, T], [N, 1]
    return pos, deltas.view(-1).to(input_ids.device)


def decode_positions(pos: torch.Tensor, deltas: torch.Tensor | None) -> torch.Tensor:
    """Position ids of one decoded token per row: ``pos`` [N] (the row's real tokens so far)
    as it is for a 1-D model ([N, 1]); moved by ``deltas`` [N] onto all three M-RoPE axes
    ([3, N, 1]) for an M-RoPE one."""
    if deltas is None:
        return pos.unsqueeze(1)  # [N, 1]
    return (pos + deltas).view(1, -1, 1).expand(3, -1, 1)  # [3, N, 1]
