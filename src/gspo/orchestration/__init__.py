"""Orchestration: who runs where (Ray placement of training ranks and rollout workers)."""
