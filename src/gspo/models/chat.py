"""How task prompts become token ids: raw text for tiny char models, a chat template otherwise.

A task's prompt is plain text ("Mia has 12 apples. ..."). For a chat model it is wrapped as one
user turn (after an optional system turn) by the tokenizer's own chat template, ending with the
generation prompt of the assistant turn, and sampling stops on the template's end-of-turn token
(``<|im_end|>`` for ChatML templates such as SmolLM2's and Qwen's). Tokenizers without a chat
template (the character tokenizer of the tiny models) keep the raw prompt, BOS prepended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gspo.config.names import CHAT_MODES

from .vision import encode_vision_prompts

__all__ = [
    "CHAT_MODES",
    "PromptFormat",
    "encode_examples",
    "end_of_turn_ids",
    "has_chat_template",
    "prompt_format",
    "template_end_id",
]

_PROBE = "\x00gspo-end-probe\x00"
"""An assistant message no template alters, to find what a template writes after a turn."""


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a (non-empty) chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def _messages(prompt: str, system_prompt: str | None) -> list[dict[str, str]]:
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*head, {"role": "user", "content": prompt}]


def template_end_id(tokenizer: Any) -> int | None:
    """The special token a chat template writes right after an assistant message, or None.

    Found by rendering a conversation with a probe assistant message and tokenizing what
    follows it, so it works for ChatML (``<|im_end|>``), Llama 3 (``<|eot_id|>``), Gemma
    (``<end_of_turn>``) and other templates alike.
    """
    if not has_chat_template(tokenizer):
        return None
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "1"}, {"role": "assistant", "content": _PROBE}],
            tokenize=False,
        )
    except Exception:  # a template that rejects the probe conversation
        return None
    if not isinstance(text, str) or _PROBE not in text:
        return None
    after = text.split(_PROBE, 1)[1]
    tail = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    special = set(getattr(tokenizer, "all_special_ids", []))
    special |= set(getattr(tokenizer, "added_tokens_decoder", None) or {})
    return int(tail[0]) if tail and tail[0] in special else None


def end_of_turn_ids(tokenizer: Any, model: Any = None) -> tuple[int, ...]:
    """Token ids that end an assistant turn: EOS, the model's generation-config EOS ids, and
    the chat template's end-of-turn token (:func:`template_end_id`)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(i) for i in eos)
    end = template_end_id(tokenizer)
    if end is not None:
        ids.add(end)
    return tuple(sorted(ids))


@dataclass(frozen=True)
class PromptFormat:
    """Turns task prompts into token ids and says which tokens end a completion."""

    tokenizer: Any = field(repr=False)
    chat: bool = False
    """Whether prompts go through the tokenizer's chat template."""
    system_prompt: str | None = None
    """The system turn (None: whatever the template does without one)."""
    stop_token_ids: tuple[int, ...] = ()
    """Ids that end a completion (for ``SamplingParams.stop_token_ids``); EOS included."""
    end_token_id: int | None = None
    """The token a supervised target ends with: the template's end-of-turn token for chat
    models (``<|im_end|>``, ``<|eot_id|>``), else EOS."""
    processor: Any = field(default=None, repr=False)
    """A vision-language model's processor (None: text only): :meth:`encode_images`."""

    def render(self, prompt: str) -> str:
        """The prompt as the model sees it (chat-formatted text, or the prompt itself)."""
        if not self.chat:
            return prompt
        return self.tokenizer.apply_chat_template(
            _messages(prompt, self.system_prompt), tokenize=False, add_generation_prompt=True
        )

    def encode(self, prompts: list[str]) -> list[list[int]]:
        """Token ids of each prompt, no padding. Raw prompts get the tokenizer's special tokens
        (BOS); chat-formatted ones none, since the template writes its own."""
        if not self.chat:
            return [
                list(ids) for ids in self.tokenizer(prompts, add_special_tokens=True)["input_ids"]
            ]
        texts = [self.render(p) for p in prompts]
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def encode_images(self, prompts: list[str], images: list[tuple]) -> tuple[list, Any]:
        """(token ids of each prompt, their :class:`~gspo.models.vision.PixelInputs`): each
        prompt's ``<image>`` placeholders expanded by the processor into the model's image
        tokens, its images (paths, bytes or PIL images; ``()`` for a text prompt) made into
        pixel inputs, once per prompt. Images of any sizes mix in one call."""
        if self.processor is None:
            raise ValueError("prompts with images need a vision-language model (--model tiny-vl)")
        texts = [self.render(p) for p in prompts]
        return encode_vision_prompts(self.processor, texts, images, special=not self.chat)


def encode_examples(fmt: PromptFormat, examples: Any) -> tuple[list[list[int]], Any]:
    """(prompt ids of each example, their :class:`~gspo.models.vision.PixelInputs` or None):
    text examples through :meth:`PromptFormat.encode`, and as soon as one example has images
    (``Example.images``), all of them through :meth:`PromptFormat.encode_images` (a text
    example among them gets no image). Text-only runs take exactly the text path."""
    texts = [e.prompt for e in examples]
    images = [tuple(getattr(e, "images", ()) or ()) for e in examples]
    if not any(images):
        return fmt.encode(texts) if texts else [], None
    return fmt.encode_images(texts, images)


def prompt_format(
    tokenizer: Any,
    *,
    mode: str = "auto",
    system_prompt: str | None = None,
    model: Any = None,
    processor: Any = None,
) -> PromptFormat:
    """The :class:`PromptFormat` for ``mode`` (one of :data:`CHAT_MODES`)."""
    if mode not in CHAT_MODES:
        raise ValueError(f"chat_template must be one of {', '.join(CHAT_MODES)}, got {mode!r}")
    available = has_chat_template(tokenizer)
    if mode == "always" and not available:
        raise ValueError(
            "chat_template='always' but the tokenizer has no chat template "
            "(use 'auto' or 'none' for raw prompts)"
        )
    chat = mode == "always" or (mode == "auto" and available)
    if system_prompt and not chat:
        raise ValueError(
            "system_prompt is set but prompts are not chat-formatted "
            f"(chat_template={mode!r}, tokenizer has a template: {available})"
        )
    stops = end_of_turn_ids(tokenizer, model) if chat else _eos_only(tokenizer)
    end = template_end_id(tokenizer) if chat else None
    if end is None:
        end = tokenizer.eos_token_id
    return PromptFormat(tokenizer, chat, system_prompt or None, stops, end, processor)


def _eos_only(tokenizer: Any) -> tuple[int, ...]:
    eos = tokenizer.eos_token_id
    return () if eos is None else (int(eos),)
