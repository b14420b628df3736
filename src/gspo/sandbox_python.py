"""Moved to `gspo.envs.sandbox.interpreter`; this path stays so existing imports keep working."""

import sys

from gspo.envs.sandbox import interpreter as _moved

sys.modules[__name__] = _moved
