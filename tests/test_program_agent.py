"""Agent programs as environments (gspo.envs.program_agent) and ``gspo serve``: a program
trains through the endpoint; the command serves a checkpoint to a real HTTP client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
pytest.importorskip("uvicorn", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
pytest.importorskip("httpx", reason="the example agent program calls the endpoint with httpx")

import gspo.compose.train as trainer_module
from gspo.config import ConfigError, TrainConfig, build
from gspo.envs import ENVIRONMENTS
from gspo.envs.agent import AgentOutcome
from gspo.envs.program_agent import ProgramAgentEnv, parse_result

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "examples" / "agent_program.py"


@pytest.mark.slow
def test_an_agent_program_trains_two_steps_through_the_endpoint(tmp_path, monkeypatch):
    env = ProgramAgentEnv(["python", str(PROGRAM)], name="program")
    monkeypatch.setitem(ENVIRONMENTS, "addition", lambda task, opts, chat: env)
    overrides = {"device": "cpu", "threads": 1, "output_dir": str(tmp_path), "task": "addition",
                 "max_turns": 2, "max_total_tokens": 24, "steps": 2, "eval_every": 2}  # fmt: skip
    cfg = build(TrainConfig, preset="smoke", overrides=overrides)
    history = trainer_module.train(cfg).history
    steps = [r for r in history if "reward/mean" in r]
    assert len(steps) == 2
    for record in steps:
        # Two chat calls per episode, one row each: no failed or cut episode.
        assert record["episode/turns_mean"] == 2 and record["episode/failed"] == 0
        assert record["episode/env_tokens_mean"] > 0  # the user's second message
        assert record["episode/policy_tokens_mean"] > 0
    # The held-out evaluation plays the program's episodes too (greedy, through the endpoint).
    evals = [r for r in history if "eval/turns_mean" in r]
    assert evals and evals[-1]["eval/turns_mean"] == 2 and evals[-1]["eval/failed"] == 0


def test_an_agent_programs_last_line_is_its_result():
    out = parse_result('log line\n{"reward": 0.5, "success": false, "info": {"turns": 2}}\n')
    assert (out.reward, out.success, out.info) == (0.5, False, {"turns": 2.0})
    for bad, match in (("", "printed nothing"), ("done", "not JSON"),
                       ('{"reward": "1"}', 'no finite "reward"'),
                       ('{"reward": 1, "success": 1}', '"success" must be')):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            parse_result(bad)


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "gspo.interface.cli", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, **kw)  # fmt: skip


@pytest.mark.slow
def test_gspo_serve_answers_an_openai_client_on_a_free_port():
    openai = pytest.importorskip("openai", reason="the test calls gspo serve with openai")
    proc = _cli("serve", "--model", "tiny", "--port", "0", "--device", "cpu",
                "--max-new-tokens", "6", "--threads", "1", "--max-n", "2")  # fmt: skip
    try:
        line = proc.stdout.readline()  # printed once it listens
        assert line.startswith("gspo serve: http://127.0.0.1:"), proc.stderr.read()
        client = openai.OpenAI(base_url=line.split()[2], api_key="any")
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "1+2="}], max_tokens=3
        )
        extra = reply.choices[0].model_extra
        assert 1 <= len(extra["token_ids"]) <= 3
        assert len(extra["token_logprobs"]) == len(extra["token_ids"])
        assert reply.model_extra["prompt_token_ids"][0] == 1  # <bos>: the prompt as served
        assert [m.id for m in client.models.list().data] == ["tiny"]
        with pytest.raises(openai.BadRequestError, match=r"n must be in 1\.\.2"):  # --max-n
            client.completions.create(model="tiny", prompt="1", n=3)
        # The tiny model has 256 positions: the context check reads them from the checkpoint.
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="tiny", prompt=[5] * 300)
        assert err.value.code == "context_length_exceeded"
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user",
            "content": "1"}], max_tokens=2, logprobs=True, top_logprobs=2)  # fmt: skip
        assert all(len(x.top_logprobs) == 2 for x in reply.choices[0].logprobs.content)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


def test_gspo_serve_refuses_bad_flags_in_one_line_before_torch_loads():
    code = (
        "import sys; from gspo.interface.cli import main; "
        "rc = main(['serve', '--model', 'nothere', '--port', '0']); "
        "assert 'torch' not in sys.modules, 'torch loaded'; sys.exit(rc)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert got.returncode == 2, got.stderr
    assert got.stderr.strip().splitlines() == [
        "gspo serve: error: --model 'nothere': no such checkpoint directory, and not a named "
        "model (tiny, smollm2-135m-instruct)"
    ]


class UrlAgent:
    """Records the base URL each episode was given; one completions call per episode."""

    name = "url_agent"

    def __init__(self) -> None:
        self.urls: list[str] = []

    async def run_episode(self, example, client):
        import httpx

        self.urls.append(client.base_url)
        async with httpx.AsyncClient(base_url=client.base_url, timeout=60) as http:
            reply = await http.post("/completions", json={"prompt": example.prompt})
            reply.raise_for_status()
        return AgentOutcome(reward=float(reply.json()["choices"][0]["text"] == example.answer))


def test_the_training_endpoint_listens_where_the_config_says(tmp_path, monkeypatch):
    with socket.socket() as s:  # a port free now, chosen at run time
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = UrlAgent()
    monkeypatch.setitem(ENVIRONMENTS, "addition", lambda task, opts, chat: agent)
    overrides = {"device": "cpu", "threads": 1, "output_dir": str(tmp_path), "task": "addition",
                 "steps": 1, "endpoint_port": port}  # fmt: skip
    trainer_module.train(build(TrainConfig, preset="smoke", overrides=overrides))
    assert len(agent.urls) == 8  # 2 prompts x 4 episodes
    assert all(u.startswith(f"http://127.0.0.1:{port}/episodes/") for u in agent.urls)
    with pytest.raises(ConfigError, match=r"endpoint_port must be in 0\.\.65535"):
        build(TrainConfig, preset="smoke", overrides={"endpoint_port": 70000})


def test_agent_episodes_train_asynchronously_through_the_generate_hook(tmp_path, monkeypatch):
    agent = UrlAgent()
    monkeypatch.setitem(ENVIRONMENTS, "addition", lambda task, opts, chat: agent)
    overrides = {"device": "cpu", "threads": 1, "output_dir": str(tmp_path), "task": "addition",
                 "steps": 3, "max_staleness": 1}  # fmt: skip
    history = trainer_module.train(build(TrainConfig, preset="smoke", overrides=overrides)).history
    steps = [r for r in history if "reward/mean" in r]
    assert len(steps) == 3 and all(r["episode/turns_mean"] == 1 for r in steps)


STUBBORN = """
import json, os, sys, time, httpx
example = json.load(sys.stdin)
open(os.environ["PID_DIR"] + f"/{os.getpid()}", "w").close()
with httpx.Client(base_url=os.environ["OPENAI_BASE_URL"], timeout=60) as http:
    while http.post("/completions", json={"prompt": example["prompt"]}).status_code == 200:
        pass
time.sleep(600)  # an agent that does not stop by itself after its episode's limit
"""


def test_a_cut_agent_program_is_killed_and_earns_its_cut_reward(tmp_path):
    import torch

    from gspo.envs.driver import Limits, run_episodes
    from gspo.envs.tasks.base import Example
    from gspo.envs.trajectory import PlainEncoder
    from gspo.models.char_tokenizer import EOS_ID, PAD_ID, build_char_tokenizer
    from gspo.models.tiny_model import build_tiny_model
    from gspo.rollout import SamplingParams
    from gspo.rollout.torch_engine import TorchEngine

    (tmp_path / "stubborn.py").write_text(STUBBORN)
    env = ProgramAgentEnv(["python", str(tmp_path / "stubborn.py")], cut_reward=-0.5,
                          env={"PID_DIR": str(tmp_path)})  # fmt: skip
    tok = build_char_tokenizer()
    engine = TorchEngine(build_tiny_model(len(tok), hidden_size=32, num_layers=1, num_heads=2,
                                          num_kv_heads=1), pad_id=PAD_ID, eos_id=EOS_ID)  # fmt: skip
    limits = Limits(max_turns=2, max_tokens_per_turn=3, max_total_tokens=100)
    _, trajs = run_episodes(engine, env, PlainEncoder(tok), [Example("1+1=", "2")], 2,
                            SamplingParams(), limits, torch.Generator().manual_seed(0))  # fmt: skip
    assert [(t.finish, t.reward) for t in trajs] == [("turns", -0.5)] * 2
    # Both calls sent the same prompt: two chains; the row is the last one's, the other counted.
    assert [(t.num_turns, t.info["unchained_calls"]) for t in trajs] == [(1, 1.0)] * 2
    pids = [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]
    assert len(pids) == 2
    for pid in pids:  # killed and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
