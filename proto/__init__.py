"""The public gRPC contract (`bert/v1/bert.proto`); `make proto` generates the Python stubs into `gen/`."""
