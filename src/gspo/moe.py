"""Moved to `gspo.models.moe`; this path stays so existing imports keep working."""

import sys

from gspo.models import moe as _moved

sys.modules[__name__] = _moved
