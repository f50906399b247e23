"""Training runs from a run config (the sections of ``medfast train``'s config)."""
from ._medfast.train import check_backends, default_config, run

__all__ = ["check_backends", "default_config", "run"]
