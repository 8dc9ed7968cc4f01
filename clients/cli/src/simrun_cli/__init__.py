"""The simrun command line."""
