"""Lists a server's services over gRPC reflection v1alpha with the official
grpcio-reflection client (it speaks only v1alpha) and resolves scd.v1.Scd.

Usage: reflection_check.py HOST:PORT
Prints the services, then each method of scd.v1.Scd; exits non-zero on failure.
"""

import sys

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from google.protobuf.descriptor_pool import DescriptorPool


def main() -> int:
    addr = sys.argv[1]
    with grpc.insecure_channel(addr) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = list(db.get_services())
        print("services:", " ".join(services))
        if "scd.v1.Scd" not in services:
            print("scd.v1.Scd is not listed", file=sys.stderr)
            return 1
        pool = DescriptorPool(db)
        scd = pool.FindServiceByName("scd.v1.Scd")
        for m in scd.methods:
            print(f"scd.v1.Scd/{m.name}: {m.input_type.full_name} -> {m.output_type.full_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
