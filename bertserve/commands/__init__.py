"""The `bertserve` subcommands, one module per pipeline stage, each exposing `register(app)`. Heavy dependencies
(torch, onnx) are imported inside the command bodies, so that `bertserve serve` never imports torch."""
