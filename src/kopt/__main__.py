"""`python -m kopt` entry point."""

from kopt.cli.main import entry

if __name__ == "__main__":
    entry()
