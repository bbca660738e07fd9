"""A DeepFM-style click-through-rate model (PyTorch), for the ParameterServer strategy.

Data: ``flextrain data ctr --out DIR`` (see ``flextrain.data.ctr``): per record
``CTR_FIELDS`` categorical ids, ``CTR_DENSE`` dense features and a 0/1 click.

Model: one ``nn.Embedding`` per field (dim ``EMBED_DIM``) plus a 1-wide
embedding per field for the first-order term; FM second-order interactions
over the field embeddings; a small MLP over the concatenated embeddings and
dense features. The output is one logit per sample.

With ``--distribution-strategy ParameterServer`` flextrain replaces each
``nn.Embedding`` by a PS-backed one (rows live on the parameter servers, only
the rows a batch uses are pulled); the other parameters are dense PS
parameters. The module also runs unchanged under AllReduce.

Module contract: ``Model``, ``loss``, ``optimizer``, ``feed``, ``eval_metrics_fn``
(``accuracy`` and ``logloss`` per sample, averaged; ``auc`` a mergeable metric).
"""

import torch
from torch import nn

from flextrain.data.ctr import CTR_DENSE, CTR_FIELDS, CTR_VOCAB, decode_ctr
from flextrain.elastic.metrics import AUC

EMBED_DIM = 8


class Model(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(v, EMBED_DIM) for v in CTR_VOCAB)
        for e in self.embeddings:
            nn.init.normal_(e.weight, std=0.05)
        self.linear = nn.ModuleList(nn.Embedding(v, 1) for v in CTR_VOCAB)
        for e in self.linear:
            nn.init.zeros_(e.weight)
        self.dense_linear = nn.Linear(CTR_DENSE, 1)
        self.mlp = nn.Sequential(nn.Linear(CTR_FIELDS * EMBED_DIM + CTR_DENSE, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, features):
        ids, dense = features["ids"], features["dense"]
        emb = torch.stack([e(ids[:, f]) for f, e in enumerate(self.embeddings)], dim=1)  # [n, F, D]
        first = sum(e(ids[:, f]) for f, e in enumerate(self.linear)).squeeze(1) + self.dense_linear(dense).squeeze(1)
        fm = 0.5 * (emb.sum(dim=1).pow(2) - emb.pow(2).sum(dim=1)).sum(dim=1)
        deep = self.mlp(torch.cat([emb.flatten(1), dense], dim=1)).squeeze(1)
        return first + fm + deep


def loss(labels, predictions):
    return nn.functional.binary_cross_entropy_with_logits(predictions, labels.float())


def optimizer(params, lr=0.01):
    return torch.optim.Adam(params, lr=lr)


def feed(records, mode, metadata):
    ids, dense, labels = decode_ctr(records, source=getattr(metadata, "source", None))
    features = {"ids": torch.from_numpy(ids), "dense": torch.from_numpy(dense)}
    if mode == "prediction":
        return features
    return features, torch.from_numpy(labels)


def eval_metrics_fn():
    return {
        "accuracy": lambda labels, predictions: ((predictions > 0).long() == labels).float(),
        "logloss": lambda labels, predictions: nn.functional.binary_cross_entropy_with_logits(
            predictions, labels.float(), reduction="none"),
        "auc": AUC(from_logits=True),  # not a per-sample mean: merged over workers by its state
    }
