"""Generated OIP v2 gRPC modules (scripts/gen_grpc_stubs.sh) and the .proto they come from."""
