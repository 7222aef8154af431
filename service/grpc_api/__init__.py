"""The gRPC front door (grpc.aio): bert.v1 servicers over the shared InferenceService, health, reflection."""
