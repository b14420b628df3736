"""Moved to `gspo.envs.sandbox.cgroup`; this path stays so existing imports keep working."""

import sys

from gspo.envs.sandbox import cgroup as _moved

sys.modules[__name__] = _moved
