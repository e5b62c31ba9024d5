"""Errors a user can act on: each carries a one-line message naming the culprit and the valid choices."""


class UserError(Exception):
    """Bad input or configuration. The CLI prints ``str(err)`` on one line and exits with status 2."""


class ConfigError(UserError, ValueError):
    """An invalid setting (environment variable, option or file)."""
