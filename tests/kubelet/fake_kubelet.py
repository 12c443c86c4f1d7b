#!/usr/bin/env python3
"""A fake kubelet for gpuwatch's tests: the PodResources v1 gRPC service on a unix socket, built
with grpcio from gpuwatch's own proto/podresources.proto, so that gpuwatch's hand-written
messages meet an independent implementation of the wire contract.

Usage: fake_kubelet.py SOCKET PODS.json PROTO

PODS.json is read at every List call, so a test can change the assignments while it runs:
[{"name": ..., "namespace": ..., "containers": [{"name": ..., "devices": [{"resource": ...,
"ids": [...]}]}]}]. Prints "ready" once it serves.
"""

import importlib
import json
import os
import sys
import tempfile
from concurrent import futures

import grpc
from grpc_tools import protoc


def main():
    socket, pods_path, proto = sys.argv[1:4]
    out = tempfile.mkdtemp(prefix="fake-kubelet-")
    proto = os.path.abspath(proto)
    rc = protoc.main(
        [
            "protoc",
            f"-I{os.path.dirname(proto)}",
            f"-I{os.path.join(os.path.dirname(protoc.__file__), '_proto')}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            proto,
        ]
    )
    if rc != 0:
        sys.exit(f"protoc failed with {rc}")
    sys.path.insert(0, out)
    pb = importlib.import_module("podresources_pb2")
    pb_grpc = importlib.import_module("podresources_pb2_grpc")

    class Lister(pb_grpc.PodResourcesListerServicer):
        def List(self, request, context):
            with open(pods_path) as f:
                pods = json.load(f)
            resp = pb.ListPodResourcesResponse()
            for p in pods:
                pod = resp.pod_resources.add(name=p["name"], namespace=p["namespace"])
                for c in p["containers"]:
                    # CPU and memory assignments too, as a real kubelet answers: gpuwatch
                    # must decode past them.
                    container = pod.containers.add(name=c["name"], cpu_ids=[0, 1])
                    memory = container.memory.add(memory_type="memory", size=1 << 30)
                    memory.topology.nodes.add(ID=0)
                    for d in c["devices"]:
                        devices = container.devices.add(
                            resource_name=d["resource"], device_ids=d["ids"]
                        )
                        devices.topology.nodes.add(ID=0)
            return resp

        def GetAllocatableResources(self, request, context):
            return pb.AllocatableResourcesResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
