"""The benchmarks, one module each, all writing their results through one report writer (`report`).

- `model`: PyTorch, transformers and every exported variant side by side (`bertserve bench-model`, `make bench`),
  with this CPU's peaks and the matrix-unit probes (`matmul_probe`);
- `service`: the server's overhead at low load and its throughput with batching on and off (`make bench-service`);
- `widths`: a bundle's CPU variants on real batches padded to multiples of 1 / 8 / 16 / 32 (`make bench-widths`);
- `gpu`: the gpu-fp16 variant on CUDA and TensorRT, and the service on a GPU (`make bench-gpu`);
- `pretraining`: training-step throughput in fp32 and bf16 autocast (`make bench-pretrain`).

They live above the stages because they measure them all (`bertserve` is the one package that may import every
stage); `cli` registers `bench-model`, the others are `python -m bertserve.benchmarks.<name>`. Importing the
package, `cli` and `report` imports no torch.
"""
