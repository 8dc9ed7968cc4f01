"""A typed Python client of simrun."""

from simrun_client.client import FINAL_RUN_STATES, Client, run_state

__all__ = ["FINAL_RUN_STATES", "Client", "run_state"]
