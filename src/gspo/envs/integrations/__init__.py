"""Outside packages as gspo tasks and environments, each named ``PREFIX:NAME`` on the command
line and behind its extra (imported only when a run uses it): ``textarena:GuessTheNumber-v0``
(:mod:`.textarena_games`), ``reasoning_gym:basic_arithmetic`` (:mod:`.reasoning_gym_tasks`).
See docs/integrations.md."""
