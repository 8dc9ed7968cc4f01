"""The kubernetes executor: one Argo Workflow per run, its pods admitted by Kueue, observed through informers.

Nothing here imports the `kubernetes` client at module level: `simrun_tracker.kubernetes.adapter` imports it when
the server config chooses this executor, so the local executor never pays its second of import time.
"""
