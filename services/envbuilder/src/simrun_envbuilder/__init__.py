"""The environment builder: locks a run's snapshots with uv and builds one environment per lock."""
