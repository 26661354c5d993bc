#!/usr/bin/env python3
"""Drive nexus from Python with nothing but gRPC server reflection.

Declares the Agent's profile (importing one runner's tools), admits an input, follows the
execution's event stream to its final answer, then resumes the stream from a cursor taken halfway.

    pip install grpcio grpcio-reflection protobuf
    python3 deploy/examples/client.py --token "$AGENT_TOKEN" --runner-id "$RUNNER_ID"
"""
import argparse
import json
import sys

import grpc
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nexus", default="127.0.0.1:7740", help="host:port of nexus serve")
    parser.add_argument("--token", required=True, help="an Agent member's bearer token")
    parser.add_argument("--runner-id", required=True, help="runner_executor_public_id to import")
    parser.add_argument("--model", default="scripted/quickstart", help="provider/model")
    parser.add_argument("--text", default="How many lines of Rust are in this repository?")
    parser.add_argument("--ca", help="PEM CA file: connect over TLS and verify nexus against it")
    args = parser.parse_args()

    if args.ca:
        with open(args.ca, "rb") as ca:
            credentials = grpc.ssl_channel_credentials(root_certificates=ca.read())
        channel = grpc.secure_channel(args.nexus, credentials)
    else:
        channel = grpc.insecure_channel(args.nexus)
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    service = pool.FindServiceByName("nexus.agent.v1.AgentService")
    metadata = [("authorization", f"Bearer {args.token}")]

    def rpc(name):
        method = service.FindMethodByName(name)
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        path = f"/{service.full_name}/{method.name}"
        make = channel.unary_stream if method.server_streaming else channel.unary_unary
        call = make(path, request_serializer=request.SerializeToString,
                    response_deserializer=response.FromString)
        return lambda **fields: call(request(**fields), metadata=metadata)

    declaration = {"configuration": {
        "runner_executor_public_ids": [args.runner_id],
        "approval_mode": "bypass",
        "default_model": args.model,
    }}
    rpc("DeclareProfile")(body_json=json.dumps(declaration))
    admitted = rpc("CreateInput")(text=args.text)
    execution = admitted.execution_public_id
    print(f"execution {execution}")

    events = list(rpc("StreamEvents")(execution_public_id=execution, follow=True))
    for event in events:
        print(f"{event.cursor:>8} {event.type:<20} {event.data_json[:100]}")
    row = rpc("GetExecution")(execution_public_id=execution)
    print(f"status {row.status}; final answer: {row.final_text}")

    middle = events[len(events) // 2]
    rest = list(rpc("StreamEvents")(execution_public_id=execution, after=middle.cursor))
    resumed = [e.cursor for e in rest] == [e.cursor for e in events[len(events) // 2 + 1:]]
    print(f"resumed after {middle.cursor}: {len(rest)} events, matching: {resumed}")
    return 0 if row.status == "completed" and resumed else 1


if __name__ == "__main__":
    sys.exit(main())
