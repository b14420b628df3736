"""gspo: RL from verifiable rewards with sequence-level policy optimization.

Importing the package is cheap and CPU-safe: heavy or optional dependencies (vLLM, Ray,
TensorBoard, wandb) are imported lazily by the modules that need them.
"""

__version__ = "0.1.0"
