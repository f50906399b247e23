"""Training runs from a run config (the sections of ``medfast train``'s config)."""
from ._medfast.train import default_config, run

__all__ = ["default_config", "run"]
