"""The OIP v2 gRPC protocol on grpc.aio: messages (``codec.py``) and the listener (``server.py``).
Importing it imports grpc: ``offload serve`` does so only when a gRPC port is asked for."""
