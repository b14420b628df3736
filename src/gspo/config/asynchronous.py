"""Asynchronous RL's choices' names. The fields (``max_staleness``, ``async_partial``,
``async_chunk_tokens``) are ``AsyncOptions``' (gspo.config.options_train), checked there and,
across components, in ``gspo.config.combinations``.
"""

from __future__ import annotations

PARTIAL_MODES = ("keep", "mask", "restart")
