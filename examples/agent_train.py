"""Train on episodes played by an agent program (examples/agent_program.py) through gspo's
OpenAI-compatible endpoint: 3 steps of 4 prompts x 4 episodes on 2-digit addition, tiny model.

    python examples/agent_train.py

Each episode runs the program as a sub-process; it calls the model twice over HTTP, and the
trainer trains on exactly the tokens it was served (docs/endpoint.md).
"""

import time

from gspo import ProgramAgentEnv, TrainConfig, register_env, train

register_env("addition")(
    lambda task, opts, chat: ProgramAgentEnv(["python", "examples/agent_program.py"])
)
SHOWN = ("reward/mean", "episode/turns_mean", "episode/failed", "episode/env_tokens_mean",
         "episode/policy_tokens_mean")  # fmt: skip

if __name__ == "__main__":
    t0 = time.time()
    cfg = TrainConfig.of(task="addition", steps=3, prompts_per_step=4, group_size=4,
                      max_new_tokens=6, max_turns=2, max_total_tokens=32, device="cpu",
                      threads=1, eval_every=0, checkpoint_every=0, progress=False,
                      output_dir="runs/agent_program")  # fmt: skip
    for record in train(cfg).history:
        if "reward/mean" in record:
            print({k: round(record[k], 3) for k in SHOWN})
    print(f"total {time.time() - t0:.1f} s")
