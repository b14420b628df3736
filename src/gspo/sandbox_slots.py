"""Moved to `gspo.envs.sandbox.slots`; this path stays so existing imports keep working."""

import sys

from gspo.envs.sandbox import slots as _moved

sys.modules[__name__] = _moved
