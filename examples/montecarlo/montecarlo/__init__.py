"""An example simrun model: Monte Carlo estimates of pi as split task types, and a report."""
