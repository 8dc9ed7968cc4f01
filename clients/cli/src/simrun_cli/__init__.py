"""The simrun command line."""

__version__ = "0.1.0"
"""The version of simrun-cli, as in its pyproject.toml (a test keeps them equal); `simrun --version` prints it
without reading the installed packages' metadata."""
