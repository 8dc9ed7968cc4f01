"""A typed Python client of simrun."""
