"""Our PyTorch BERT and everything that trains it.

Importing the package is cheap and torch-free: `bert_model.tasks`, `bert_model.tokenization` and
`bert_model.registry` are used by the service, which has no torch. Model classes live in
`bert_model.modeling` / `bert_model.heads` (torch).
"""
