"""The composition root: the one place that turns a config into a run's parts (policy and
backend, rollout engine, task, reward, environment, batch source, logger) and hands them to the
loop. ``train`` (RL), ``sft`` (the supervised cold start), ``parts`` (the builders),
``ray_check`` (is the Ray backend usable here). No layer below imports it."""
