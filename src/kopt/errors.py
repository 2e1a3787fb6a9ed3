"""Domain exceptions. Only the CLI turns them into exit codes and stderr lines."""

from __future__ import annotations


class KoptError(Exception):
    """Base of every error kopt reports to the user as one line."""

    exit_code = 1


class UsageError(KoptError):
    """Bad input from the user: an argument, a config file, a path. Exit code 2."""

    exit_code = 2


class CaseError(UsageError):
    """Unknown case id or malformed case file."""


class WorkspaceError(UsageError):
    """The workspace (or its git repository) is not in a state the command can act on."""


class CandidateLoadError(KoptError):
    """The candidate file cannot be loaded or does not follow the contract."""


class LedgerError(UsageError):
    """The ledger cannot be read or written."""


class BrowserError(UsageError):
    """No headless Chromium to render the report with, or it failed to render."""
