"""gspo plugin: registers the verifiers 0.4 environment of ``vf_arith.py`` (beside this file) as
the task ``vf_arith``. Run from this folder: ``gspo train --plugin gspo_vf_arith --task vf_arith``
(docs/verifiers.md). Needs ``pip install "gspo[verifiers]"``."""

from gspo.envs.verifiers_v1 import register_verifiers_v1

register_verifiers_v1(
    "vf_arith",
    "vf_arith",  # the taskset module verifiers imports (vf_arith.py)
    taskset={"num_tasks": 1000, "max_operand": 9},
    agent={"harness": {"id": "vf_arith", "max_turns": 2}},
)
