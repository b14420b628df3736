"""Orchestration: the training loop and evaluation over built parts, and who runs where (Ray
placement of training ranks and rollout workers)."""
