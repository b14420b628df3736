"""Moved to `gspo.orchestration.signals`; this path stays so existing imports keep working."""

import sys

from gspo.orchestration import signals as _moved

sys.modules[__name__] = _moved
