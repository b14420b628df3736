"""Moved to `gspo.models.pretrained`; this path stays so existing imports keep working."""

import sys

from gspo.models import pretrained as _moved

sys.modules[__name__] = _moved
