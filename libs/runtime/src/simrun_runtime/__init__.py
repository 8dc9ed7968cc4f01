"""What runs inside a simrun pod and what a model imports."""
