"""Moved to `gspo.core.losses_family`; this path stays so existing imports keep working."""

import sys

from gspo.core import losses_family as _moved

sys.modules[__name__] = _moved
