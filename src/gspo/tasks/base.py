"""Moved to `gspo.envs.tasks.base`; this path stays so existing imports keep working."""

import sys

from gspo.envs.tasks import base as _moved

sys.modules[__name__] = _moved
