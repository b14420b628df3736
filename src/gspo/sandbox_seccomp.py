"""Moved to `gspo.envs.sandbox.seccomp`; this path stays so existing imports keep working."""

import sys

from gspo.envs.sandbox import seccomp as _moved

sys.modules[__name__] = _moved
