"""The bertserve inference service: REST (FastAPI) and gRPC front doors over one dynamically batched engine.

Data flow (one way): request -> tokenizer features (`bert_model.tasks`) -> per-model batcher -> backend
(ONNX Runtime in-process or Triton) -> task post-processing (`bert_model.tasks`) -> JSON / protobuf.
Imports no torch: only the torch-free parts of `bert_model` (tasks, tokenization, registry).
"""
