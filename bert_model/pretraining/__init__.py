"""BERT pretraining: corpus -> documents -> NSP pairs -> MLM masking -> shards -> the training loop.

Stages, in data-flow order (Devlin et al. 2019, section 3.1 and appendix A): `corpus` (documents and sentences,
streamed), `vocab` (WordPiece training with `tokenizers`), `instances` (NSP pairs), `masking` (80/10/10 MLM
corruption, whole-word option), `shards` + `build` (the sharded data folder), `dataset` (resumable stream,
dynamic masking), `optim` (AdamW, LAMB, warm-up + linear decay), `trainer` (the loop, DDP under torchrun),
`resume` (exact checkpoints), `cli` (`pretrain-data`, `pretrain-vocab`, `pretrain`); the throughput benchmark is
`bertserve.benchmarks.pretraining`.
Submodules are imported where used: the data stages are torch-free.
"""
