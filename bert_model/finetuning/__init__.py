"""Fine-tuning and evaluation for classification, SQuAD and NER (PyTorch), on top of `bert_model.tasks`.

One entry point per task family (`classify`, `qa`, `ner`) shares one training loop (`trainer`): AdamW with
linear warm-up then linear decay (Devlin et al. 2019, appendix A.3), length-grouped batches, optional bf16
autocast, periodic evaluation with best-checkpoint selection, metrics as JSON lines. Evaluation turns model
outputs into predictions with exactly the torch-free functions the service uses (`bert_model.tasks`), so
training-time figures and served answers cannot disagree. `cli` holds the `finetune`, `evaluate` and
`retrieval-eval` commands (`retrieval_eval`: question -> paragraph retrieval through a running service and through
sentence-transformers).
"""
