"""Moved to `gspo.orchestration.logging`; this path stays so existing imports keep working."""

import sys

from gspo.orchestration import logging as _moved

sys.modules[__name__] = _moved
