"""Orchestration: the training loop and evaluation over built parts."""
