"""Task heads on top of BertModel: pretraining (MLM + NSP), masked LM alone, sequence / token classification,
extractive QA, for every family of the encoder.

References: Devlin et al. (2019), section 3.1 (masked LM and next-sentence prediction) and section 4 / figure 4
(fine-tuning: [CLS] -> linear for classification, per-token linear for tagging, start/end vectors for SQuAD).
A family changes a head's configuration, not its class: RoBERTa, ELECTRA and DistilBERT classify from the first
token's state through a two-layer head instead of the pooler, and the masked-LM transform of ELECTRA and ALBERT
narrows to embedding_size so that the decoder can share the word embeddings. `MODEL_CLASSES` maps every
`transformers` architecture name of the family onto these classes. Losses are computed only when labels are
given; -100 marks positions without a label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bert_model.checkpoint import PreTrainedMixin
from bert_model.config import FAMILIES, SUPPORTED_MODEL_TYPES, BertConfig
from bert_model.modeling import BertModel, activation

IGNORE_INDEX = -100


# ---- outputs ------------------------------------------------------------------------------------------
@dataclass
class PreTrainingOutput:
    seq_relationship_logits: torch.Tensor
    """(B, 2) next-sentence logits: index 0 = IsNext, 1 = NotNext (BERT's convention)."""
    prediction_logits: torch.Tensor | None = None
    """(B, S, V) masked-LM logits at every position (Hugging Face's field); given when no labels are."""
    masked_lm_logits: torch.Tensor | None = None
    """(M, V) masked-LM logits of the M labelled positions (labels != -100) only, in row-major order
    (`labels[labels != -100]` lines up with it); given instead of `prediction_logits` when labels are, since the
    vocabulary projection dominates the head's cost."""
    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None


@dataclass
class MaskedLMOutput:
    logits: torch.Tensor
    """(B, S, V) masked-LM scores over the vocabulary at every position."""
    loss: torch.Tensor | None = None


@dataclass
class SequenceClassifierOutput:
    logits: torch.Tensor
    """(B, num_labels)."""
    loss: torch.Tensor | None = None


@dataclass
class TokenClassifierOutput:
    logits: torch.Tensor
    """(B, S, num_labels)."""
    loss: torch.Tensor | None = None


@dataclass
class QuestionAnsweringOutput:
    start_logits: torch.Tensor
    """(B, S) score of each token as the answer start."""
    end_logits: torch.Tensor
    """(B, S) score of each token as the answer end."""
    loss: torch.Tensor | None = None


# ---- pretraining heads --------------------------------------------------------------------------------
class BertPredictionHeadTransform(nn.Module):
    """dense (H -> E) -> activation -> LayerNorm: hidden states into the word-embedding space."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_width)
        self.transform_act_fn = activation(config.family.lm_activation or config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.embedding_width, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class BertLMPredictionHead(nn.Module):
    """Transform, then a decoder whose weight is tied to the word embeddings (plus its own bias)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.embedding_width, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))  # (B, S, V)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output: torch.Tensor, pooled_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


class BertForPreTraining(PreTrainedMixin, nn.Module):
    """BERT with the masked-LM head (tied to the word embeddings) and the next-sentence head (model_type bert only:
    the other families pretrain without NSP, see BertForMaskedLM)."""

    architecture_suffix: ClassVar[str] = "ForPreTraining"
    tied_weights: ClassVar[dict[str, str]] = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight"
    }

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if config.model_type != "bert":
            raise ValueError(
                f"next-sentence pretraining is BERT's (model_type 'bert'), not {config.model_type!r}'s: "
                "use BertForMaskedLM"
            )
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=True)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the MLM decoder matrix with the input word embeddings (one parameter, two uses)."""
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> PreTrainingOutput:
        encoded = self.bert(input_ids, attention_mask, token_type_ids)
        assert encoded.pooler_output is not None
        nsp_logits = self.cls.seq_relationship(encoded.pooler_output)
        output = PreTrainingOutput(seq_relationship_logits=nsp_logits)
        if labels is None:
            output.prediction_logits = self.cls.predictions(encoded.last_hidden_state)  # (B, S, V)
        else:
            output.masked_lm_logits = self._sparse_mlm_logits(encoded.last_hidden_state, labels)  # (M, V)
            output.mlm_loss = self._mlm_loss(output.masked_lm_logits, labels)
            output.loss = output.mlm_loss
        if next_sentence_label is not None:
            output.nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.view(-1))
            output.loss = output.nsp_loss if output.loss is None else output.loss + output.nsp_loss
        return output

    def _sparse_mlm_logits(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(M, V) logits of the M labelled positions only."""
        return self.cls.predictions(hidden[labels != IGNORE_INDEX])

    @staticmethod
    def _mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        targets = labels[labels != IGNORE_INDEX]  # (M,)
        if targets.numel() == 0:
            return logits.sum() * 0.0  # no masked position in the batch: zero loss, graph kept
        return F.cross_entropy(logits.float(), targets)


class BertOnlyMLMHead(nn.Module):
    """The masked-LM head alone, under the name Hugging Face's `BertForMaskedLM` uses (`cls.predictions`)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.predictions(sequence_output)


class BertForMaskedLM(PreTrainedMixin, nn.Module):
    """BERT with the masked-LM head only (no pooler, no NSP head): what fill-mask serves. Loads the checkpoints of
    Hugging Face's `BertForMaskedLM` and `BertForPreTraining` (whose pooler and NSP head go unused)."""

    architecture_suffix: ClassVar[str] = "ForMaskedLM"
    tied_weights: ClassVar[dict[str, str]] = BertForPreTraining.tied_weights

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the MLM decoder matrix with the input word embeddings (one parameter, two uses)."""
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> MaskedLMOutput:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.cls(hidden)  # (B, S, V)
        output = MaskedLMOutput(logits=logits)
        if labels is not None:
            output.loss = F.cross_entropy(
                logits.float().view(-1, self.config.vocab_size), labels.view(-1), ignore_index=IGNORE_INDEX
            )
        return output


# ---- fine-tuning heads --------------------------------------------------------------------------------
class ClassificationHead(nn.Module):
    """dense -> activation -> dropout -> out_proj on the first token's state: RoBERTa's (tanh), ELECTRA's (GELU)
    and DistilBERT's (ReLU; `pre_classifier` and `classifier` in its checkpoints) sentence head."""

    def __init__(self, config: BertConfig, activation_name: str) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = activation(activation_name)
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dropout(self.activation(self.dense(features))))  # (B, num_labels)


class BertForSequenceClassification(PreTrainedMixin, nn.Module):
    """[CLS] -> pooler -> dropout -> linear (BERT, ALBERT), or the first token -> dropout -> ClassificationHead
    (RoBERTa, ELECTRA; DistilBERT without the first dropout). The loss follows `config.problem_type`."""

    architecture_suffix: ClassVar[str] = "ForSequenceClassification"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if config.num_labels < 1:
            raise ValueError("sequence classification needs labels: set config.id2label (e.g. with_labels)")
        self.config = config
        family = config.family
        self.on_pooler = family.classifier_activation is None
        self.bert = BertModel(config, add_pooling_layer=self.on_pooler)
        self.dropout = nn.Dropout(_classifier_dropout(config)) if family.classifier_input_dropout else nn.Identity()
        self.classifier: nn.Module = (
            nn.Linear(config.hidden_size, config.num_labels)
            if family.classifier_activation is None
            else ClassificationHead(config, family.classifier_activation)
        )
        self.init_weights()

    def problem_type_of(self, labels: torch.Tensor) -> str:
        """`config.problem_type`, or when None what Hugging Face infers: regression for one output, else
        single-label for integer labels and multi-label for float ones."""
        if self.config.problem_type is not None:
            return self.config.problem_type
        if self.config.num_labels == 1:
            return "regression"
        return "multi_label_classification" if labels.is_floating_point() else "single_label_classification"

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> SequenceClassifierOutput:
        encoded = self.bert(input_ids, attention_mask, token_type_ids)
        features = encoded.pooler_output if self.on_pooler else encoded.last_hidden_state[:, 0]  # (B, H)
        assert features is not None
        logits = self.classifier(self.dropout(features))  # (B, num_labels)
        output = SequenceClassifierOutput(logits=logits)
        if labels is not None:
            output.loss = self._loss(logits.float(), labels)
        return output

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        problem = self.problem_type_of(labels)
        if problem == "regression" and self.config.num_labels == 1:
            return F.mse_loss(logits.squeeze(-1), labels.float().view(-1))  # (B,) against (B,) or (B, 1)
        if problem == "regression":
            return F.mse_loss(logits, labels.float())  # (B, num_labels)
        if problem == "multi_label_classification":
            return F.binary_cross_entropy_with_logits(logits, labels.float())  # (B, num_labels) of 0/1
        return F.cross_entropy(logits, labels.view(-1))


class BertForTokenClassification(PreTrainedMixin, nn.Module):
    """Per-token linear classifier (NER). Loss ignores label -100 (special tokens, later word pieces)."""

    architecture_suffix: ClassVar[str] = "ForTokenClassification"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if config.num_labels < 1:
            raise ValueError("token classification needs labels: set config.id2label (e.g. with_labels)")
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> TokenClassifierOutput:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.classifier(self.dropout(hidden))  # (B, S, num_labels)
        output = TokenClassifierOutput(logits=logits)
        if labels is not None:
            output.loss = F.cross_entropy(
                logits.float().view(-1, self.config.num_labels), labels.view(-1), ignore_index=IGNORE_INDEX
            )
        return output


class BertForQuestionAnswering(PreTrainedMixin, nn.Module):
    """Start and end logits per token (SQuAD span extraction); loss = mean of the two cross-entropies."""

    architecture_suffix: ClassVar[str] = "ForQuestionAnswering"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        start_logits, end_logits = self.qa_outputs(hidden).split(1, dim=-1)  # 2 x (B, S, 1)
        output = QuestionAnsweringOutput(
            start_logits=start_logits.squeeze(-1).contiguous(), end_logits=end_logits.squeeze(-1).contiguous()
        )
        if start_positions is not None and end_positions is not None:
            # Positions outside the window (answer not in it) are clamped to S and ignored.
            ignored = output.start_logits.shape[1]
            starts = start_positions.view(-1).clamp(0, ignored)
            ends = end_positions.view(-1).clamp(0, ignored)
            start_loss = F.cross_entropy(output.start_logits.float(), starts, ignore_index=ignored)
            end_loss = F.cross_entropy(output.end_logits.float(), ends, ignore_index=ignored)
            output.loss = (start_loss + end_loss) / 2
        return output


def _classifier_dropout(config: BertConfig) -> float:
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


HEAD_CLASSES: tuple[type[PreTrainedMixin], ...] = (
    BertModel,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertForQuestionAnswering,
)
"""The classes every family has, each named by its `architecture_suffix` in `transformers`."""

MODEL_CLASSES: dict[str, type[PreTrainedMixin]] = {
    FAMILIES[model_type].class_prefix + head.architecture_suffix: head
    for model_type in SUPPORTED_MODEL_TYPES
    for head in HEAD_CLASSES
} | {"BertForPreTraining": BertForPreTraining}
"""Architecture name in config.json (`RobertaForSequenceClassification`, ...) -> the class that loads it."""
