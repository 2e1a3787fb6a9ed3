"""kopt.eval."""
