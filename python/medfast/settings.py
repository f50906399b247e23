"""medfast's settings: ``get(name)``, ``set(name, value)``, ``show()``.

Values come from ``set`` (highest), then the ``MEDFAST_<NAME>`` environment
variables read at import, then the defaults (``medfast config show`` lists them).
"""
from ._medfast.settings import get, set, show  # noqa: A004

__all__ = ["get", "set", "show"]
