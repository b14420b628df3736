"""Moved to `gspo.envs.sandbox.boot`; this path stays so existing imports keep working."""

import sys

from gspo.envs.sandbox import boot as _moved

sys.modules[__name__] = _moved
