"""Moved to `gspo.envs.sandbox.compare`; this path stays so existing imports keep working."""

import sys

from gspo.envs.sandbox import compare as _moved

sys.modules[__name__] = _moved
