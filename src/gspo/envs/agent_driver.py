"""The agent driver: runs agent episodes (:mod:`gspo.envs.agent`) over the run's engine."""

from __future__ import annotations


def run_agent_episodes(
    engine,
    env,
    encoder,
    examples,
    n,
    params,
    limits,
    generator=None,
    version: int = 0,
    generate=None,
    prompts=None,
):
    """``n`` agent episodes per example, as :func:`gspo.envs.driver.run_episodes` returns them."""
    raise NotImplementedError("agent episodes: the endpoint driver is being written")
