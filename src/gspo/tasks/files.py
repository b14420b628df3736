"""Moved to `gspo.envs.tasks.files`; this path stays so existing imports keep working."""

import sys

from gspo.envs.tasks import files as _moved

sys.modules[__name__] = _moved
