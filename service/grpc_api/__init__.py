"""The gRPC front door (grpc.aio): bert.v1 servicers over the engine, health, reflection."""
