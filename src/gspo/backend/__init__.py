"""Training backends: the policy update of one batch, in this process or over FSDP2 ranks.

Every backend implements :class:`gspo.backend.base.TrainingBackend`; the training loop talks to
that protocol only, so the local process and Ray-placed FSDP2 ranks share one loop.
"""
