"""The version, on the ground floor: every layer may name it."""

__version__ = "0.1.0"
