"""Integrity of candidates: static source checks (the rule table in `rules`, the AST checker in `checker`,
`static_check` in `static`) and the dynamic guards of the evaluation child (`guards`: tamper snapshots,
input mutation, aliasing, poisoned allocations)."""

from kopt.integrity.rules import RULES, Finding
from kopt.integrity.static import static_check

__all__ = ["Finding", "RULES", "static_check"]
