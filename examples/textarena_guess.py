"""TextArena's GuessTheNumber as a gspo multi-turn environment (a plugin module).

Needs the ``textarena`` extra (``pip install "gspo[textarena]"``). Importing this module
registers the task ``textarena_guess`` and its environment, so either of these selects it:

    gspo train --plugin examples.textarena_guess --task textarena_guess ...
    gspo train --env examples.textarena_guess:make_env --task textarena_guess ...

(or, from Python, ``import examples.textarena_guess`` before ``gspo.train``/``gspo.evaluate``).

Each problem is a TextArena seed. ``reset`` creates the game once and returns its first
observation as the episode's :class:`gspo.Opening` (the policy's prompt); each policy turn is
one TextArena action (a guess in square brackets, e.g. ``[10]``), answered with the game's new
messages ("The target number is lower."). The episode's reward is TextArena's: 1 for a win, and
for a game lost at TextArena's own turn limit its partial credit (1 - distance / range). Success
is the game result: a win only, never a lost game's partial credit. An episode cut by gspo's
limits (``--max-turns``, ``--max-total-tokens``) before the game ends earns ``cut_reward`` 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gspo import Example, Opening, Step, Task, register_env, register_task

ENV_ID = "GuessTheNumber-v0-raw"
"""TextArena's game without its LLM wrappers (numbers 1-20, 10 guesses)."""
DESCRIPTION = "TextArena GuessTheNumber: guess a number in [1, 20] as '[n]', told higher/lower."
WIN = 1.0
"""TextArena pays 1 for a win only; a lost game's partial credit is below it."""
INSTALL = 'textarena_guess needs TextArena: pip install "gspo[textarena]"'


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:
        raise ImportError(INSTALL) from exc
    return textarena


@dataclass
class _Game:
    game: Any
    """The TextArena environment of this episode (created in ``reset``)."""
    player: int


HINT = re.compile(r"The target number is (higher|lower)\.")
PLAIN_OPENING = "guess [1-20]:"
"""The opening of plain-text (char model) episodes: TextArena's 560-character instructions do
not fit a tiny model's 256 positions, so plain mode says the same in a few characters."""


def _messages(observation: list[tuple[int, str, Any]], player: int) -> list[str]:
    """The game's messages of an observation (the player's own actions are already its turns)."""
    return [msg for sender, msg, *_ in observation if sender != player]


def _plain(message: str) -> str:
    """A game message in plain mode: its hint word alone ("The target number is lower." ->
    "lower"); other messages (an invalid move's reason) as they are."""
    hint = HINT.fullmatch(message.strip())
    return hint.group(1) if hint else message


class TextArenaGuess:
    """A TextArena single-player game as a gspo environment. Chat models see TextArena's own
    text; plain-text (tiny char) models a compact rendering of it: the opening
    :data:`PLAIN_OPENING` and hint words, e.g. ``guess [1-20]:[10] lower [5] higher [7]``."""

    multi_turn = True
    cut_reward = 0.0
    """An episode gspo cuts (its turn or token limit) before the game ends earns nothing."""

    def __init__(self, env_id: str = ENV_ID, *, chat: bool = False) -> None:
        self.name = "textarena_guess"
        self.env_id = env_id
        self.chat = chat
        # a guess ends at its closing bracket (TextArena reads the first [n] of a turn)
        self.stop_strings: tuple[str, ...] = ("]",)
        self.games_created = 0
        self._ta = _textarena()

    def _reply(self, messages: list[str]) -> list[dict[str, str]]:
        if self.chat:
            return [{"role": "user", "content": "\n".join(messages)}]
        return [{"role": "user", "content": " " + " ".join(map(_plain, messages)) + " "}]

    def reset(self, example: Example) -> Opening:
        game = self._ta.make(self.env_id)
        game.reset(num_players=1, seed=int(example.meta["seed"]))
        self.games_created += 1
        player, observation = game.get_observation()
        text = "\n".join(_messages(observation, player)) if self.chat else PLAIN_OPENING
        return Opening(_Game(game, player), [{"role": "user", "content": text}])

    def step(self, state: _Game, text: str, finished: bool) -> Step:
        done, _ = state.game.step(text)
        if not done:
            player, observation = state.game.get_observation()
            state.player = player
            return Step(done=False, messages=self._reply(_messages(observation, player)))
        rewards, _ = state.game.close()
        reward = float(rewards[state.player])
        return Step(done=True, reward=reward, success=reward >= WIN)


def make_env(task: Task, opts: Any, chat: bool) -> TextArenaGuess:
    """The environment factory (``--env examples.textarena_guess:make_env``)."""
    return TextArenaGuess(chat=chat)


def _no_reward(completion: str, example: Example) -> float:
    """The task's reward outside its environment: none (the game scores its episodes)."""
    return 0.0


def _demo(seed: int) -> str:
    """A plain-mode binary search of the game of ``seed`` (SFT's cold-start demonstration;
    the hidden number is read from a throwaway game: demonstrations only)."""
    game = _textarena().make(ENV_ID)
    game.reset(num_players=1, seed=seed)
    target, lo, hi, out = game.game_number, game.min_number, game.max_number, []
    while True:
        mid = (lo + hi) // 2
        if mid == target:
            return "".join(out) + f"[{mid}]"
        word = "higher" if mid < target else "lower"
        out.append(f"[{mid}] {word} ")
        lo, hi = (mid + 1, hi) if mid < target else (lo, mid - 1)


@register_task("textarena_guess")
def make_task(*, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None) -> Task:
    """Problems are TextArena seeds, train and test disjoint. The prompt is plain mode's
    opening, which the game's own opening (:class:`gspo.Opening`) replaces in episodes; train
    rows carry binary-search demonstrations for ``gspo sft`` (``difficulty`` is unused)."""
    base = 1_000_000 * seed

    def rows(first: int, n: int, demos: bool) -> list[Example]:
        return [
            Example(prompt=PLAIN_OPENING, answer="", meta={"seed": first + i, "problem": f"seed {first + i}"},
                    demo=_demo(first + i) if demos else None)
            for i in range(n)
        ]  # fmt: skip

    return Task("textarena_guess", rows(base, n_train, True), rows(base + 500_000, n_test, False),
                _no_reward, f"{DESCRIPTION} (seed {seed})")  # fmt: skip


register_env("textarena_guess")(make_env)


def main(argv: list[str] | None = None) -> None:
    """SFT a tiny char model on binary-search demonstrations, train it briefly with GSPO, then
    score the saved model with gspo eval's function: the held-out success of the trainer's last
    evaluation and of gspo eval are printed side by side."""
    import argparse
    import json
    from pathlib import Path

    from gspo import EvalConfig, SFTConfig, TrainConfig, evaluate, run_sft, train

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--output-dir", default="runs/textarena_guess")
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--n-test", type=int, default=50)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    out = Path(args.output_dir)
    limits = dict(max_turns=8, max_tokens_per_turn=6, max_total_tokens=96)
    common = dict(task="textarena_guess", n_test=args.n_test, seed=0, device="cpu",
                  threads=args.threads, max_new_tokens=6, **limits)  # fmt: skip
    run_sft(SFTConfig(**common, model="tiny", output_dir=str(out / "sft"), steps=args.sft_steps,
                      batch_size=64, n_train=256, progress=False))  # fmt: skip
    result = train(
        TrainConfig(**common, model=str(out / "sft"), output_dir=str(out / "rl"), n_train=256,
                    steps=args.steps, prompts_per_step=4, group_size=4, eval_every=args.steps,
                    progress=False)
    )  # fmt: skip
    trained = {k.split("/", 1)[1]: v for k, v in result.final_eval.items()}
    final = str(out / "rl" / "final")
    report = evaluate(EvalConfig(**common, model=final, samples=args.samples, output=None,
                                 progress=False, show=0))  # fmt: skip
    keys = ("success", "success_se", "final_reward", "turns_mean", "greedy_accuracy")
    got = {"train": {k: trained[k] for k in keys}, "eval": report["metrics"]}
    print(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
