"""An agent program for gspo's agent episodes (ProgramAgentEnv, docs/endpoint.md).

gspo runs it once per episode with OPENAI_BASE_URL (this episode's endpoint), OPENAI_API_KEY,
GSPO_MODEL, GSPO_SAMPLING and the example as JSON on stdin. It plays two turns of a chat (the
problem, then the same problem again after its first answer) and prints its result as the
last stdout line: {"reward": ..., "success": ..., "info": {...}}.

Only httpx is needed (the openai client works the same way:
``openai.OpenAI().chat.completions.create(model=..., messages=...)``).
"""

import json
import os
import sys

import httpx


def main() -> None:
    example = json.load(sys.stdin)
    base = os.environ["OPENAI_BASE_URL"]
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    model = os.environ.get("GSPO_MODEL", "gspo-policy")
    messages = [{"role": "user", "content": example["prompt"]}]
    correct = 0
    with httpx.Client(base_url=base, headers=headers, timeout=600) as client:
        for _ in range(2):
            reply = client.post("/chat/completions", json={"model": model, "messages": messages})
            if reply.status_code == 400 and reply.json()["error"]["type"] == "episode_limit":
                break  # gspo ends this episode itself (its cut_reward)
            reply.raise_for_status()
            answer = reply.json()["choices"][0]["message"]["content"]
            correct += answer.strip() == example["answer"]
            # The next request repeats the conversation: gspo reuses its exact tokens.
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "\n" + example["prompt"]},
            ]
    reward = correct / 2
    print(json.dumps({"reward": reward, "success": correct == 2, "info": {"correct": correct}}))


if __name__ == "__main__":
    main()
