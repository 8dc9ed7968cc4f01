"""A discrete-event cluster simulator."""
