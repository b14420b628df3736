"""Moved to `gspo.interface.cli_parsers`; this path stays so existing imports keep working."""

import sys

from gspo.interface import cli_parsers as _moved

sys.modules[__name__] = _moved
