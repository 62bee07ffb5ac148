"""gRPC server reflection under both names tools ask for: `grpc.reflection.v1` and `v1alpha`.

grpcio-reflection serves only `v1alpha`; current grpcurl, buf curl and
Postman ask `v1` first. The two protocols have the same messages under
another package, byte for byte on the wire, so `v1` is the same servicer
behind a second method path, and its descriptor (`v1alpha`'s, renamed) is
added to the pool so that it can be described like any other service.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1 = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1}.ServerReflection"


def enable(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serves reflection of `service_names` (and of both reflection services) on `server`."""
    _add_v1_descriptor()
    names = (*service_names, reflection.SERVICE_NAME, V1_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {"ServerReflectionInfo": handler}),)
    )


def _add_v1_descriptor() -> None:
    pool = descriptor_pool.Default()
    name = "grpc/reflection/v1/reflection.proto"
    try:
        pool.FindFileByName(name)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = name
    proto.package = V1
    proto.options.Clear()
    for message in proto.message_type:
        for f in message.field:
            if f.type_name.startswith(".grpc.reflection.v1alpha."):
                f.type_name = f.type_name.replace(".v1alpha.", ".v1.", 1)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(".v1alpha.", ".v1.", 1)
            method.output_type = method.output_type.replace(".v1alpha.", ".v1.", 1)
    pool.Add(proto)
