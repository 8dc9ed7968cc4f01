"""The run tracker: runs, tasks and pods through an executor port."""
