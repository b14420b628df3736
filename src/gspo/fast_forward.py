"""Moved to `gspo.models.fast_forward`; this path stays so existing imports keep working."""

import sys

from gspo.models import fast_forward as _moved

sys.modules[__name__] = _moved
