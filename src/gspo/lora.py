"""Moved to `gspo.models.lora`; this path stays so existing imports keep working."""

import sys

from gspo.models import lora as _moved

sys.modules[__name__] = _moved
