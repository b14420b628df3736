"""Token-in, token-out trajectories: one token sequence per episode, built incrementally.

A trajectory is ``prompt ids + turn_1 + env_1 + turn_2 + env_2 + ... + turn_K``:

* policy turns are the engine's own output tokens, appended as sampled (never decoded and
  re-tokenized), with the engine's per-token log-probs;
* environment replies are rendered through the chat template *incrementally*: only the text
  the template adds after the conversation so far is tokenized (:class:`ChatEncoder`), or, for
  tokenizers without a template (the tiny char models), the reply text itself
  (:class:`PlainEncoder`).

The loss mask is 1 only on policy tokens. Environment tokens are context: the training forward
attends to them, but they get no gradient and count in no length. For a multi-turn trajectory,
GSPO's |y_i| (the length normalizing the sequence log-ratio) and LUSPO's length factor are the
number of *policy* tokens, summed over all turns; token-mean aggregation counts policy tokens
only too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gspo.rollout.base import NO_VERSION, Rollout

from .base import Message


class TemplateError(ValueError):
    """The chat template cannot be applied incrementally (it rewrites earlier turns)."""


class PlainEncoder:
    """Tokenizers without a chat template: the prompt with BOS, replies as raw text."""

    chat = False
    fmt: Any = None  # the run's PromptFormat (make_encoder)

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def start(self, prompt: str) -> tuple[list[int], list[Message]]:
        return self.start_messages([{"role": "user", "content": prompt}])

    def start_messages(self, messages: list[Message]) -> tuple[list[int], list[Message]]:
        """An opening observation (:class:`gspo.envs.base.Opening`) as the prompt: its text."""
        text, history, special = self.start_text(messages)
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"]), history

    def start_text(self, messages: list[Message]) -> tuple[str, list[Message], bool]:
        """(the prompt text of ``messages``, the history, whether the tokenizer adds its
        special tokens), before tokenizing (image openings go through the processor)."""
        return "".join(m["content"] for m in messages), [dict(m) for m in messages], True

    def reply_ids(
        self, history: list[Message], last_turn: list[int], messages: list[Message]
    ) -> list[int]:
        text = self.reply_text(history, last_turn, messages)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def reply_text(
        self, history: list[Message], last_turn: list[int], messages: list[Message]
    ) -> str:
        """The text of a reply, before tokenizing (image replies go through the processor)."""
        return "".join(m["content"] for m in messages)


class ChatEncoder:
    """Chat-template models: each reply is the text the template adds after the conversation
    so far, ending with the next assistant generation prompt.

    ``history`` holds the assistant turns as decoded text; only the rendering of the *new*
    messages is tokenized, so the policy's tokens are never re-tokenized. Templates that
    rewrite earlier turns when a message is added (the render is then not a prefix of the
    longer one, e.g. templates that drop earlier reasoning) raise :class:`TemplateError`.
    """

    chat = True
    fmt: Any = None  # the run's PromptFormat (make_encoder)

    def __init__(self, tokenizer: Any, end_token_id: int, system_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.end_token_id = end_token_id
        self.end_text = tokenizer.decode([end_token_id])
        self.system_prompt = system_prompt

    def start(self, prompt: str) -> tuple[list[int], list[Message]]:
        return self.start_messages([{"role": "user", "content": prompt}])

    def start_messages(self, messages: list[Message]) -> tuple[list[int], list[Message]]:
        """The prompt of ``messages`` (after the system prompt, if any), ending with the
        assistant's generation prompt."""
        text, history, _ = self.start_text(messages)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]), history

    def start_text(self, messages: list[Message]) -> tuple[str, list[Message], bool]:
        """(the rendered prompt of ``messages``, the history, False: the template writes its
        own special tokens), before tokenizing (image openings go through the processor)."""
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        history = [*head, *(dict(m) for m in messages)]
        text = self.tokenizer.apply_chat_template(
            history, tokenize=False, add_generation_prompt=True
        )
        return text, history, False

    def reply_ids(
        self, history: list[Message], last_turn: list[int], messages: list[Message]
    ) -> list[int]:
        text = self.reply_text(history, last_turn, messages)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def reply_text(
        self, history: list[Message], last_turn: list[int], messages: list[Message]
    ) -> str:
        """The text the template adds for ``messages`` after ``history`` (see the class doc),
        before tokenizing (image replies go through the processor)."""
        render = self.tokenizer.apply_chat_template
        base = render(history, tokenize=False)
        full = render([*history, *messages], tokenize=False, add_generation_prompt=True)
        if not full.startswith(base):
            raise TemplateError(
                "the chat template rewrites earlier turns when a message is added, so it "
                "cannot be applied incrementally (token-in, token-out needs a prefix-stable "
                "template)"
            )
        # What the template writes after an assistant message (e.g. "<|im_end|>\n"): the
        # policy's turn already holds the end token when it stopped on it.
        after = base.rsplit(self.end_text, 1)[1] if self.end_text in base else ""
        lead = after if last_turn and last_turn[-1] == self.end_token_id else self.end_text + after
        return lead + full[len(base) :]


def make_encoder(tokenizer: Any, fmt: Any) -> PlainEncoder | ChatEncoder:
    """The encoder matching the run's :class:`gspo.models.chat.PromptFormat` (kept as its
    ``fmt``: image prompts are encoded by the format's processor)."""
    if getattr(fmt, "chat", False):
        enc: PlainEncoder | ChatEncoder = ChatEncoder(
            tokenizer, fmt.end_token_id, fmt.system_prompt
        )
    else:
        enc = PlainEncoder(tokenizer)
    enc.fmt = fmt
    return enc


@dataclass
class Trajectory:
    """One episode as one token sequence after its prompt, with its masks and records."""

    prompt_ids: list[int]
    history: list[Message]
    ids: list[int] = field(default_factory=list)
    """Every token after the prompt: policy turns and environment replies, in order."""
    policy: list[bool] = field(default_factory=list)
    """Per token of ``ids``: True for tokens the policy sampled (the loss mask)."""
    logprobs: list[float] = field(default_factory=list)
    """Per token of ``ids``: the engine's log-prob (0.0 on environment tokens)."""
    turn: list[int] = field(default_factory=list)
    """Per token of ``ids``: the index of the policy turn it belongs to, -1 for env tokens."""
    versions: list[int] = field(default_factory=list)
    """Per token of ``ids``: the policy version that generated it (async runs), NO_VERSION for
    env tokens and for policy tokens of engines that record none."""
    turn_rewards: list[float] = field(default_factory=list)
    reward: float = 0.0
    finish: str = ""
    """"stop" (the environment ended it), "length" (a token limit cut a turn), "turns" (the
    turn limit), "failed" (a tool or the environment hung or raised)."""
    tool_calls: int = 0
    tool_errors: int = 0
    info: dict[str, float] = field(default_factory=dict)
    """The environment's per-episode values (:attr:`gspo.envs.base.Step.info`), last wins."""
    success: bool | None = None
    """The environment's verdict on the finished episode (:attr:`gspo.envs.base.Step.success`
    of its final step; False when the driver cut it; None: the environment reported none)."""
    done: bool = False
    episode: int | None = None
    """Agent episodes that train every chain of calls (one row per chain): the episode this
    row belongs to, numbered group after group; None: the row is its episode."""
    pixels: Any = None
    """The episode's pixel inputs so far (a one-entry :class:`gspo.models.vision.PixelInputs`:
    its prompt's images, then those of each environment reply, in order), None: no image."""

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def policy_tokens(self) -> int:
        return sum(self.policy)

    @property
    def env_tokens(self) -> int:
        return len(self.ids) - self.policy_tokens

    def context(self) -> list[int]:
        """Everything the policy conditions its next turn on."""
        return self.prompt_ids + self.ids

    def add_policy(
        self, ids: list[int], logprobs: list[float], versions: list[int] | None = None
    ) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} policy tokens but {len(logprobs)} log-probs")
        if versions is not None and len(versions) != len(ids):
            raise ValueError(f"{len(ids)} policy tokens but {len(versions)} versions")
        self.versions += [NO_VERSION] * len(ids) if versions is None else versions
        k = len(self.turn_rewards)
        self.ids += ids
        self.policy += [True] * len(ids)
        self.logprobs += logprobs
        self.turn += [k] * len(ids)
        self.turn_rewards.append(0.0)

    def add_env(self, ids: list[int]) -> None:
        self.ids += ids
        self.policy += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.turn += [-1] * len(ids)
        self.versions += [NO_VERSION] * len(ids)


def to_rollout(
    trajectories: list[Trajectory],
    prompt_index: list[int],
    pad_id: int,
    versions: bool = False,
    logprob_dtype: torch.dtype = torch.float32,
) -> Rollout:
    """Pack trajectories into a :class:`Rollout` (prompts left-padded, the rest right-padded).

    ``completion_mask`` is 1 on every real token after the prompt (policy and environment:
    the attention mask of the training forward); ``loss_mask`` is 1 on policy tokens only;
    ``extras["turn_ids"]`` [N, L] holds each policy token's turn index (-1 elsewhere);
    with ``versions``, ``Rollout.versions`` [N, L] each token's policy version (NO_VERSION on
    environment tokens and padding). ``logprob_dtype``: the engine's (float64 engines keep
    their precision).
    """
    n = len(trajectories)
    p = max(len(t.prompt_ids) for t in trajectories)
    length = max(1, max(len(t.ids) for t in trajectories))
    prompt_ids = torch.full((n, p), pad_id, dtype=torch.long)  # [N, P]
    prompt_mask = torch.zeros((n, p), dtype=torch.long)  # [N, P]
    ids = torch.full((n, length), pad_id, dtype=torch.long)  # [N, L]
    mask = torch.zeros((n, length), dtype=torch.long)  # [N, L]
    loss_mask = torch.zeros((n, length), dtype=torch.long)  # [N, L]
    logprobs = torch.zeros((n, length), dtype=logprob_dtype)  # [N, L]
    turns = torch.full((n, length), -1, dtype=torch.long)  # [N, L]
    stamps = torch.full((n, length), NO_VERSION, dtype=torch.long)  # [N, L]
    for i, t in enumerate(trajectories):
        m = len(t.prompt_ids)
        prompt_ids[i, p - m :] = torch.tensor(t.prompt_ids)
        prompt_mask[i, p - m :] = 1
        k = len(t.ids)
        if k:
            ids[i, :k] = torch.tensor(t.ids)
            mask[i, :k] = 1
            loss_mask[i, :k] = torch.tensor(t.policy, dtype=torch.long)
            logprobs[i, :k] = torch.tensor(t.logprobs, dtype=logprob_dtype)
            turns[i, :k] = torch.tensor(t.turn)
            stamps[i, :k] = torch.tensor(t.versions, dtype=torch.long)
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=ids,
        completion_mask=mask,
        logprobs=logprobs,
        finish_reasons=[t.finish for t in trajectories],
        prompt_index=torch.tensor(prompt_index, dtype=torch.long),
        extras={"turn_ids": turns},
        loss_mask=loss_mask,
        versions=stamps if versions else None,
    )
