"""Moved to `gspo.orchestration.dynamic_sampling`; this path stays so existing imports keep working."""

import sys

from gspo.orchestration import dynamic_sampling as _moved

sys.modules[__name__] = _moved
