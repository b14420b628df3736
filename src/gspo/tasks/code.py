"""Moved to `gspo.envs.tasks.code`; this path stays so existing imports keep working."""

import sys

from gspo.envs.tasks import code as _moved

sys.modules[__name__] = _moved
