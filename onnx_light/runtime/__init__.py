"""The runtime: sessions that wire the kernel library to the tuning core."""

from .dispatch import UnsupportedOperatorError
from .session import InvalidInputError, NodeArg, RuntimeSession

__all__ = ["InvalidInputError", "NodeArg", "RuntimeSession", "UnsupportedOperatorError"]
