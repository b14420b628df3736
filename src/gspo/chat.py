"""Moved to `gspo.models.chat`; this path stays so existing imports keep working."""

import sys

from gspo.models import chat as _moved

sys.modules[__name__] = _moved
