"""Moved to `gspo.envs.tasks.synthetic`; this path stays so existing imports keep working."""

import sys

from gspo.envs.tasks import synthetic as _moved

sys.modules[__name__] = _moved
