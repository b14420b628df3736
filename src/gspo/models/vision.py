"""Vision-language policies: the tiny random-init ``tiny-vl`` model, processors, pixel inputs.

The family is Idefics3 (the architecture of SmolVLM): a SigLIP vision tower, a pixel-shuffle
connector and a Llama text model. It was picked over Qwen2/2.5/3-VL because its text model uses
plain 1-D positions: the image's tokens are ordinary sequence positions whose embeddings the
connector overwrites. So the left-padding position ids, the KV-cached decode of the torch engine
and the one-pass scoring of ``token_logprobs`` work for it exactly as for a text model; the
Qwen-VL families' 3-D M-RoPE would need per-family position bookkeeping in every one of them.

A prompt's text holds one ``<image>`` per image. The processor expands each into the model's
image tokens (``<fake_token_around_image><global-img><image>*k<fake_token_around_image>``) and
makes the pixel inputs; :class:`PixelInputs` keeps them per prompt (computed once, shared by the
prompt's group of samples) and :meth:`PixelInputs.rows` hands each row its prompt's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.images import IMAGE_PLACEHOLDER, load_image
from .char_tokenizer import PAD_ID, build_char_tokenizer
from .tiny_model import seeded_model, tiny_text_config
from .vision_qwen import QwenPixelInputs, QwenVLProcessor, uses_mrope

__all__ = [
    "IMAGE_PLACEHOLDER",
    "TINY_VL_CHAT_TEMPLATE",
    "PixelInputs",
    "build_tiny_vl",
    "is_vision_model",
    "load_image",
    "processor_for",
]


_VL_SPECIAL = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]

TINY_VL_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
"""Idefics3's chat layout over plain string contents (``<image>`` stays in the text, where the
processor expands it); the turn ends with ``<end_of_utterance>``, the stop token."""

_VISION_TYPES = {"idefics3", "smolvlm", "qwen2_5_vl"}


def is_vision_model(model: Any) -> bool:
    """Whether ``model`` (possibly LoRA-wrapped) is an image-text model this package drives."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) in _VISION_TYPES


def build_tiny_vl(
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    image_size: int = 56,
    patch_size: int = 14,
    vision_hidden: int = 32,
    seed: int = 0,
):
    """(model, tokenizer): a random-init Idefics3 over the char tokenizer plus its image special
    tokens and :data:`TINY_VL_CHAT_TEMPLATE`. An image is resized to ``image_size`` on its
    longest edge, padded square, and becomes (image_size / patch_size)^2 / 4 image tokens
    (4 at the defaults: a 56x56 image, 14-pixel patches, as the ``shapes`` task draws). Weights depend only on the arguments; the global RNG is untouched."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    if image_size % (2 * patch_size):
        raise ValueError(f"image_size {image_size} must be a multiple of 2 x patch_size")
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(_VL_SPECIAL)})
    tok.chat_template = TINY_VL_CHAT_TEMPLATE
    text = tiny_text_config(
        len(tok), hidden_size, num_layers, num_heads, num_kv_heads, model_type="llama"
    )
    vision = dict(
        hidden_size=vision_hidden,
        intermediate_size=2 * vision_hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=patch_size,
    )
    config = Idefics3Config(
        text_config=text,
        vision_config=vision,
        scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids(IMAGE_PLACEHOLDER),
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
    )
    # sdpa, as the tiny text models: engine and one-pass scoring agree in float64.
    config._attn_implementation = "sdpa"
    return seeded_model(Idefics3ForConditionalGeneration, config, seed), tok


def processor_for(model: Any, tokenizer: Any, path: str | Path | None = None):
    """The processor of a vision model: the one saved at ``path`` (a checkpoint folder with a
    ``processor_config.json`` or ``preprocessor_config.json``), else one derived from the model's config (no image
    splitting, the vision tower's input size), which is what ``tiny-vl`` uses."""
    saved = ("processor_config.json", "preprocessor_config.json")  # transformers 5, 4
    if uses_mrope(model):  # Qwen2.5-VL: this package's processor (no video processor)
        if path is not None and any((Path(path) / name).is_file() for name in saved):
            return QwenVLProcessor.load(path, tokenizer)
        _need_pillow()
        return QwenVLProcessor.derived(model, tokenizer)
    if path is not None and any((Path(path) / name).is_file() for name in saved):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(str(path), local_files_only=True)
    _need_pillow()
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor

    cfg = model.config
    side = int(cfg.vision_config.image_size)
    patch = int(cfg.vision_config.patch_size)
    seq_len = int((side // patch) ** 2 / (cfg.scale_factor**2))
    images = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": side},
        max_image_size={"longest_edge": side},
    )
    return Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=seq_len)


def _need_pillow() -> None:
    try:
        import PIL  # noqa: F401  (the image processors resize with Pillow)
    except ImportError:
        raise ModuleNotFoundError(
            "vision-language models need Pillow: pip install 'gspo[vision]'"
        ) from None


@dataclass
class PixelInputs:
    """The pixel inputs of B prompts, one entry per prompt (padded to the most images of any).

    ``values`` [B, I, 3, H, W]; ``mask`` [B, I, H, W] marks the real pixels of each (resized,
    padded) image. A prompt with fewer images than I has all-zero padding images, which the
    model drops. Rows of a rollout index it by their ``prompt_index``.
    """

    values: torch.Tensor  # [B, I, 3, H, W]
    mask: torch.Tensor  # [B, I, H, W]
    images: list[list[Any]] | None = field(default=None, repr=False, compare=False)
    """The decoded source images (``PIL.Image``, RGB) of each prompt, for an engine that runs
    its own copy of the processor on them (vLLM); None where only the tensors were kept."""

    @property
    def num_prompts(self) -> int:
        return self.values.shape[0]

    def rows(self, prompt_index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Forward keywords for rows whose prompts are ``prompt_index`` [N]."""
        idx = prompt_index.to(self.values.device)
        return {
            "pixel_values": self.values.index_select(0, idx),  # [N, I, 3, H, W]
            "pixel_attention_mask": self.mask.index_select(0, idx),  # [N, I, H, W]
        }

    def forward_inputs(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_index: torch.Tensor,
    ) -> tuple[dict[str, torch.Tensor], None]:
        """The training forward's keywords for rows ``input_ids`` [N, T] of entries
        ``prompt_index`` [N] (:func:`image_inputs`: the tower once per entry), and no position
        override (1-D positions)."""
        return image_inputs(model, input_ids, self, prompt_index), None

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> PixelInputs:
        values = self.values.to(device=device, dtype=dtype)
        return PixelInputs(values, self.mask.to(device), self.images)

    def entry(self, i: int, count: int | None = None) -> PixelInputs:
        """Prompt ``i`` alone (one entry), its first ``count`` images (None: all, padding
        included): the start of an episode's images (:mod:`gspo.envs.driver`)."""
        end = self.values.shape[1] if count is None else count
        return PixelInputs(self.values[i : i + 1, :end], self.mask[i : i + 1, :end])

    def extend(self, more: PixelInputs) -> PixelInputs:
        """One entry's images followed by ``more``'s (both one entry): an episode's images
        after an environment reply that shows new ones."""
        values = torch.cat([self.values, more.values.to(self.values.dtype)], dim=1)
        return PixelInputs(values, torch.cat([self.mask, more.mask], dim=1))  # [1, I+K, ...]

    @classmethod
    def cat(cls, parts: list[PixelInputs]) -> PixelInputs:
        """The prompts of ``parts`` in order (prompt indices offset as the rollouts' are)."""
        most = max(p.values.shape[1] for p in parts)
        values = [_pad_images(p.values, most) for p in parts]
        masks = [_pad_images(p.mask, most) for p in parts]
        images = None
        if all(p.images is not None for p in parts):
            images = [imgs for p in parts for imgs in p.images]
        return cls(torch.cat(values), torch.cat(masks), images)


def _pad_images(t: torch.Tensor, count: int) -> torch.Tensor:
    extra = count - t.shape[1]
    if extra == 0:
        return t
    pad = t.new_zeros((t.shape[0], extra, *t.shape[2:]))
    return torch.cat([t, pad], dim=1)


def encode_vision_prompts(
    processor: Any, texts: list[str], images: list[tuple], *, special: bool
) -> tuple[list[list[int]], PixelInputs | None]:
    """(token ids per text, their pixel inputs or None when no text has an image). Each text
    goes through the processor alone with its images (it expands every ``<image>``); a text
    without images is tokenized as is and gets all-zero padding images."""
    if len(texts) != len(images):
        raise ValueError(f"{len(texts)} prompts but {len(images)} image lists")
    tok = processor.tokenizer
    qwen = isinstance(processor, QwenVLProcessor)
    ids: list[list[int]] = []
    pixels: list[tuple[torch.Tensor, torch.Tensor] | None] = []
    sources: list[list[Any]] = []
    for i, (text, imgs) in enumerate(zip(texts, images, strict=True)):
        placeholders = text.count(IMAGE_PLACEHOLDER)
        if placeholders != len(imgs):
            raise ValueError(
                f"prompt {i}: {placeholders} {IMAGE_PLACEHOLDER} placeholder(s) for "
                f"{len(imgs)} image(s); put one {IMAGE_PLACEHOLDER} where each image goes"
            )
        if not imgs:
            ids.append(list(tok(text, add_special_tokens=special)["input_ids"]))
            pixels.append(None)
            sources.append([])
            continue
        pil = [load_image(im, where=f"prompt {i}, image {j}") for j, im in enumerate(imgs)]
        sources.append(pil)
        if qwen:  # patches and grids of the prompt's images, its placeholders expanded
            one, entry = processor.encode_one(text.split(IMAGE_PLACEHOLDER), pil, special=special)
            ids.append(one)
            pixels.append(entry)
            continue
        out = processor(text=[text], images=[pil], add_special_tokens=special, return_tensors="pt")
        ids.append(out["input_ids"][0].tolist())
        pixels.append((out["pixel_values"][0], out["pixel_attention_mask"][0].bool()))
    real = [p for p in pixels if p is not None]
    if not real:
        return ids, None
    if qwen:
        return ids, QwenPixelInputs.of(pixels)
    most = max(v.shape[0] for v, _ in real)
    _, c, h, w = real[0][0].shape  # every image is padded to the processor's square size
    values = torch.zeros((len(texts), most, c, h, w), dtype=real[0][0].dtype)  # [B, I, 3, H, W]
    mask = torch.zeros((len(texts), most, h, w), dtype=torch.bool)  # [B, I, H, W]
    for i, p in enumerate(pixels):
        if p is not None:
            values[i, : p[0].shape[0]] = p[0]
            mask[i, : p[1].shape[0]] = p[1]
    return ids, PixelInputs(values, mask, sources)


def image_inputs(
    model: Any, input_ids: torch.Tensor, pixels: PixelInputs, prompt_index: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Forward keywords for rows ``input_ids`` [N, T] of prompts ``prompt_index`` [N]: their
    input embeddings with each prompt's image features in its image tokens' slots.

    The vision tower and connector run once per distinct prompt, not once per row: a group's
    rows share their prompt's features (``index_select`` sums the rows' gradients back into
    them, so the tower gets the per-row path's gradient). Idefics3's own keyword for
    precomputed features (``image_hidden_states``, renamed ``mm_encoder_outputs`` in
    transformers 5.19 and changing shape in 5.20) is not used: the features are merged here.
    """
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        # An FSDP2 root gathers its own parameters (the embedding, the vision tower) only
        # inside its forward; calling the tower here would meet sharded weights. Ranks take
        # the per-row keywords instead (the same values, the tower once per row).
        return per_row_image_inputs(model, input_ids, pixels, prompt_index)
    uniq, inverse = torch.unique(prompt_index.to(pixels.values.device), return_inverse=True)
    values = pixels.values.index_select(0, uniq)  # [U, I, 3, H, W]
    mask = pixels.mask.index_select(0, uniq)  # [U, I, H, W]
    embeds = model.get_input_embeddings()(input_ids)  # [N, T, D]
    # All-zero images are padding (the model's own rule): they have no features and no slots.
    real = (values != 0).flatten(2).any(-1)  # [U, I]
    if not bool(real.any()):
        return {"inputs_embeds": embeds}
    features = model.get_image_features(values, mask, return_dict=True).pooler_output  # [R, S, D]
    if isinstance(features, (list, tuple)):
        # Newer transformers (5.2x) give one [images * S, D] tensor per prompt instead.
        flat = torch.cat(list(features))  # [R * S, D]
        features = flat.reshape(int(real.sum()), -1, flat.shape[-1])  # [R, S, D]
    counts = real.sum(1)  # [U] real images per prompt, in the order of ``features``
    first = (counts.cumsum(0) - counts).tolist()  # [U] each prompt's first feature row
    counts = counts.tolist()
    take = [first[u] + j for u in inverse.tolist() for j in range(counts[u])]
    rows = features.index_select(0, torch.tensor(take, device=features.device))  # [sum, S, D]
    rows = rows.reshape(-1, rows.shape[-1]).to(embeds.dtype)  # [sum * S, D]
    slots = input_ids == model.config.image_token_id  # [N, T]
    if int(slots.sum()) != rows.shape[0]:
        raise ValueError(
            f"{int(slots.sum())} image tokens in the rows but {rows.shape[0]} image features "
            "from their pixel inputs (an image's placeholder count does not match its images)"
        )
    return {"inputs_embeds": embeds.masked_scatter(slots.unsqueeze(-1), rows)}  # [N, T, D]


def per_row_image_inputs(
    model: Any, input_ids: torch.Tensor, pixels: PixelInputs, prompt_index: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The reference for :func:`image_inputs`: every row's pixels expanded, so the model runs
    its vision tower once per row (what the training forward did before; tests and
    ``benchmarks/vision_prompts.py`` compare against it)."""
    return {"input_ids": input_ids, **pixels.rows(prompt_index)}


def blocked_token_ids(model: Any) -> tuple[int, ...]:
    """Token ids a vision-language policy must never sample: its image placeholder (a sampled
    one would ask the training forward for an image that does not exist). The engine and
    ``token_logprobs`` both give them probability 0, so their log-probs still agree."""
    image = getattr(getattr(model, "config", None), "image_token_id", None)
    return (int(image),) if is_vision_model(model) and image is not None else ()


def block_tokens(logits: torch.Tensor, ids: tuple[int, ...]) -> torch.Tensor:
    """``logits`` [..., V] with ``ids`` at -inf (out of place: it may carry a graph)."""
    if not ids:
        return logits
    index = torch.tensor(ids, device=logits.device)
    return logits.index_fill(-1, index, float("-inf"))


def check_pixels(model: Any, prompt_ids: torch.Tensor, pixels: Any) -> None:
    """A clear error where a vision model gets image tokens but no pixel inputs: without them
    it would silently read the image tokens as text."""
    if pixels is not None or not is_vision_model(model):
        return
    image = getattr(model.config, "image_token_id", None)
    if image is not None and bool((prompt_ids == image).any()):
        raise ValueError(
            "prompts hold image tokens but no pixel inputs came with them (a rollout that lost "
            "its extras['pixels'], or a path that does not carry images yet)"
        )


def save_processor(model: Any, tokenizer: Any, folder: str | Path) -> None:
    """Write a vision model's processor (image processor, chat template) into ``folder``
    beside its tokenizer, so the checkpoint loads back with it; nothing for a text model."""
    if tokenizer is not None and is_vision_model(model):
        processor_for(model, tokenizer).save_pretrained(str(folder))
