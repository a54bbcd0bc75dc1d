#!/usr/bin/env bash
# Regenerates offload/serve/proto/grpc_predict_v2_pb2.py (the messages) from grpc_predict_v2.proto;
# the server registers its methods through grpc's generic handlers, so no _grpc stub module is kept.
# The generated module is committed (the serve extra needs no build step); the header of each
# names the protoc that made it. Needs grpcio-tools: .venv/bin/pip install grpcio-tools
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m grpc_tools.protoc -I. --python_out=. offload/serve/proto/grpc_predict_v2.proto
# A private descriptor pool: the messages' full names (inference.ModelInferRequest, ...) are the wire
# contract, and tritonclient.grpc registers the same names in the default pool; two registrations
# of one name in one pool fail at import ("duplicate symbol"), so a process could not hold both.
sed -i 's/_descriptor_pool\.Default()\.AddSerializedFile(/_descriptor_pool.DescriptorPool().AddSerializedFile(/' offload/serve/proto/grpc_predict_v2_pb2.py
grep -q "DescriptorPool().AddSerializedFile" offload/serve/proto/grpc_predict_v2_pb2.py
echo "generated with grpcio-tools $("$PY" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))')"
