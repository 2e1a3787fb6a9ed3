"""Integrity of candidates: static source checks (this package) next to the dynamic guards (kopt.integrity.guards)."""

from kopt.integrity.rules import RULES, Finding
from kopt.integrity.static import static_check

__all__ = ["Finding", "RULES", "static_check"]
