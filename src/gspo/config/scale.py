"""The scale-out choices' names (backend, placement). The fields are ``BackendOptions``'
(gspo.config.options_train), checked there and, across components, in
``gspo.config.combinations``; ``gspo.compose.ray_check.check_backend_available`` checks the
machine (Ray installed, the cluster reachable) before any work.
"""

from __future__ import annotations

BACKENDS = ("local", "ray")
PLACEMENTS = ("colocated", "separate")
REWARD_PLACEMENTS = ("auto", "driver", "ray")
