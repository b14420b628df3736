"""Agent programs as environments (gspo.envs.program_agent) and ``gspo serve``: a program
trains through the endpoint; the command serves a checkpoint to a real HTTP client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
pytest.importorskip("uvicorn", reason="the endpoint needs the serve extra (fastapi, uvicorn)")
pytest.importorskip("httpx", reason="the example agent program calls the endpoint with httpx")

import gspo.compose.train as trainer_module
from gspo.config import TrainConfig, build
from gspo.envs import ENVIRONMENTS
from gspo.envs.program_agent import ProgramAgentEnv, parse_result

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "examples" / "agent_program.py"


def test_an_agent_program_trains_two_steps_through_the_endpoint(tmp_path, monkeypatch):
    env = ProgramAgentEnv(["python", str(PROGRAM)], name="program")
    monkeypatch.setitem(ENVIRONMENTS, "addition", lambda task, opts, chat: env)
    overrides = {"device": "cpu", "threads": 1, "output_dir": str(tmp_path), "task": "addition",
                 "max_turns": 2, "max_total_tokens": 24, "steps": 2}  # fmt: skip
    cfg = build(TrainConfig, preset="smoke", overrides=overrides)
    steps = [r for r in trainer_module.train(cfg).history if "reward/mean" in r]
    assert len(steps) == 2
    for record in steps:
        # Two chat calls per episode, one row each: no failed or cut episode.
        assert record["episode/turns_mean"] == 2 and record["episode/failed"] == 0
        assert record["episode/env_tokens_mean"] > 0  # the user's second message
        assert record["episode/policy_tokens_mean"] > 0


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


def test_gspo_serve_answers_an_openai_client_on_a_free_port():
    openai = pytest.importorskip("openai", reason="the test calls gspo serve with openai")
    proc = _cli("serve", "--model", "tiny", "--port", "0", "--device", "cpu",
                "--max-new-tokens", "6", "--threads", "1")  # fmt: skip
    try:
        line = proc.stdout.readline()  # printed once it listens
        assert line.startswith("gspo serve: http://127.0.0.1:"), proc.stderr.read()
        client = openai.OpenAI(base_url=line.split()[2], api_key="any")
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "1+2="}], max_tokens=3
        )
        extra = reply.choices[0].model_extra
        assert 1 <= len(extra["token_ids"]) <= 3
        assert len(reply.choices[0].logprobs.content) == len(extra["token_ids"])
        assert reply.model_extra["prompt_token_ids"][0] == 1  # <bos>: the prompt as served
        assert [m.id for m in client.models.list().data] == ["tiny"]
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
