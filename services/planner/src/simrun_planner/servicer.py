"""The planner's gRPC servicer: decode, one call of the domain, encode."""

from __future__ import annotations

import grpc
from simrun.v1 import common_pb2, planner_pb2, planner_pb2_grpc

from simrun_planner import convert
from simrun_planner.planning import plan_task, shape


class PlannerService(planner_pb2_grpc.PlannerServiceServicer):
    """Sizes worker pods and decides how many pieces a task runs in; `PlanError` becomes FAILED_PRECONDITION."""

    def ShapePod(
        self, request: planner_pb2.ShapePodRequest, context: grpc.ServicerContext
    ) -> planner_pb2.ShapePodResponse:
        pod = shape(
            convert.resources_from_proto(request.resources),
            convert.nodes_from_proto(request.nodes),
            convert.max_processes_from_proto(request.max_processes),
            run_id=request.run_id or None,
        )
        return planner_pb2.ShapePodResponse(shape=convert.shape_to_proto(pod))

    def PlanTask(
        self, request: planner_pb2.PlanTaskRequest, context: grpc.ServicerContext
    ) -> planner_pb2.PlanTaskResponse:
        plan = plan_task(
            convert.TaskRef(request.task_id),
            common_pb2.TaskType(name=request.task_type, split=request.split),
            convert.resources_from_proto(request.resources),
            convert.nodes_from_proto(request.nodes),
            convert.mode_from_proto(request.mode),
            convert.priority_from_proto(request.priority),
            request.units if request.HasField("units") else None,
            convert.pod_start_from_proto(request.pod_start_s),
            run_id=request.run_id or None,
        )
        return planner_pb2.PlanTaskResponse(plan=convert.plan_to_proto(plan))
