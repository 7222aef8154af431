"""Torch-free task logic (numpy + tokenizers only), shared by fine-tuning evaluation and the service.

Feature building and post-processing per task family (classification, SQuAD span extraction, NER), the
metrics, and the serving-bundle contract (`spec`). Nothing under this package may import torch: the serving
image has none, and a test enforces it.
"""
