"""Algorithm core: pure functions of tensors and scalars (losses, advantages, correction, KL)."""
