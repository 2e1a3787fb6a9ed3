"""kopt.workspace."""
