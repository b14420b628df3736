"""Moved to `gspo.envs.sandbox`; this path stays so existing imports keep working."""

import sys

from gspo.envs import sandbox as _moved

sys.modules[__name__] = _moved
