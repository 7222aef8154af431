"""The load tests' peers: the same models served by other stacks, measured beside ours.

`naive_server`: FastAPI + Hugging Face `transformers` pipelines on PyTorch, one request per forward pass.
`triton_peer`: a REST front to a real Triton server (`triton_models`: our bundles and task code behind Triton's
dynamic batcher). `loadtests.targets` starts them (`bertserve loadtest --peers`).
"""
