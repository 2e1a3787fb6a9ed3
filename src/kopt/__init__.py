"""kopt: an agentic kernel-optimization workspace and CLI for GQA decode attention."""

__version__ = "0.1.0"
