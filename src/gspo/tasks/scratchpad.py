"""Moved to `gspo.envs.tasks.scratchpad`; this path stays so existing imports keep working."""

import sys

from gspo.envs.tasks import scratchpad as _moved

sys.modules[__name__] = _moved
