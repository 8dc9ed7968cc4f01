"""End to end: a pod that allocates past its memory is killed, retried with 1.5 times the memory, or fails."""

from __future__ import annotations

import json

from e2e_support import wait_final, write_workflow
from simrun.v1 import common_pb2
from simrun_runtime.layout import StoreLayout

# One core per node: one process per pod, so a pod has base 0.5 + 0.5 GiB = 1 GiB, its retry 0.5 + 0.75 -> 2 GiB.
NODES = [{"name": "node-a", "cores": 1, "memory_gb": 6}]


def hog(model, mib: int):
    return write_workflow(
        model,
        f"""
name: hog
tasks:
  hog:
    type: e2etasks.tasks:Hog
    settings: {{units: 1, mib: {mib}}}
""",
    )


def test_a_unit_past_its_memory_is_retried_with_one_and_a_half_times_and_succeeds(start_server, client_for, e2e_model):
    server = start_server(nodes=NODES)
    client = client_for(server)
    run = client.submit(hog(e2e_model, 1400))
    plan = run.tasks[0].plan
    assert (plan.pods, plan.shape.memory_gb, plan.shape.retry_memory_gb) == (1, 1, 2)
    final = wait_final(client, run.run_id)
    assert final.state == common_pb2.RUN_STATE_SUCCEEDED, final.message
    assert len(final.oom_kills) == 1
    kill = final.oom_kills[0]
    assert (kill.task_id, kill.worker, kill.memory_gb) == ("hog", "w0", 1)
    # The task's pod, both attempts together: started twice, killed once for memory, its peak measured.
    [pod] = final.tasks[0].pods
    assert (pod.worker, pod.attempts, pod.oom_kills, pod.sigkills, pod.memory_gb) == ("w0", 2, 1, 0, 2)
    assert not pod.HasField("peak_memory_gb") or pod.peak_memory_gb > 1.3
    task = StoreLayout(server.config.store).run(run.run_id).task("hog")
    assert json.loads(task.summary.read_text()) == {"mib": 1400}


def test_a_second_kill_for_memory_fails_the_run_naming_the_retry_memory(start_server, client_for, e2e_model):
    server = start_server(nodes=NODES)
    client = client_for(server)
    run = client.submit(hog(e2e_model, 2600))
    final = wait_final(client, run.run_id)
    assert final.state == common_pb2.RUN_STATE_FAILED
    assert "2 GiB" in final.message, final.message
    assert len(final.oom_kills) == 2
    assert [k.memory_gb for k in final.oom_kills] == [1, 2]
    assert final.tasks[0].state == common_pb2.TASK_STATE_FAILED
