"""Moved to `gspo.envs.rewards`; this path stays so existing imports keep working."""

import sys

from gspo.envs import rewards as _moved

sys.modules[__name__] = _moved
