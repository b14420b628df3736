"""Moved to `gspo.rollout.build`; this path stays so existing imports keep working."""

import sys

from gspo.rollout import build as _moved

sys.modules[__name__] = _moved
