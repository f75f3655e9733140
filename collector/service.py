"""The collector's parts for a latscope process: OTLP receivers over one store."""

from __future__ import annotations

from latscope.collector.receiver import TraceReceiver
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from latscope.config import Settings
from latscope.parts import Parts
from latscope.storage import Store


def collector_parts(settings: Settings, store: Store) -> Parts:
    receiver = TraceReceiver(store)
    return Parts(
        grpc_servicers=[
            lambda server: trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
                receiver, server
            )
        ]
    )
