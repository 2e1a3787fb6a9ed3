"""Integrity of candidates: static source checks (the rule table in `rules`, the AST checker in `checker`,
`static_check` in `static`) and the dynamic guards of the evaluation child (`guards`: tamper snapshots,
input mutation, aliasing, poisoned allocations)."""

__all__ = ["Finding", "RULES", "static_check"]


def __getattr__(name: str):
    """The static checker, imported on first use: the evaluation child imports `guards` alone."""
    if name in ("Finding", "RULES"):
        from kopt.integrity import rules

        return getattr(rules, name)
    if name == "static_check":
        from kopt.integrity.static import static_check

        return static_check
    raise AttributeError(f"module 'kopt.integrity' has no attribute {name!r}")
