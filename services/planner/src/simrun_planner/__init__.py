"""The planner: the shape of a worker pod and the number of pieces of a task."""
