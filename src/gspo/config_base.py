"""Moved to `gspo.config.fields`; this path stays so existing imports keep working."""

import sys

from gspo.config import fields as _moved

sys.modules[__name__] = _moved
