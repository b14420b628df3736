"""The interface layer, at the top: config presets and validation, the command line, ``gspo
compare`` and the comparison report (:mod:`gspo.interface.report`). Nothing below imports it."""
