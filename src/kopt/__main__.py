"""`python -m kopt` entry point."""

from kopt.cli.main import main

if __name__ == "__main__":
    main()
