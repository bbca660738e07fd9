"""KerasPSTrainer: a Keras model under the ParameterServer strategy.

The task loop, set-up/recovery and push retries are ``PSTrainer``'s
(``flextrain.worker.ps_trainer``); this subclass supplies the Keras parts:

* The PS optimizer is configured from the module's Keras optimizer
  (:func:`keras_optimizer_config`: SGD with momentum/nesterov, Adam, AdamW,
  Adagrad; anything else is refused with a message naming it).
* Every ``tf.keras.layers.Embedding`` of the model becomes a PS table (named
  by the layer's name, initialised like the layer's own weights): its
  ``call`` is replaced, on that instance only, by a lookup that pulls the
  distinct ids of the batch from the PS (one row per id) and gathers them. In
  training the pulled rows are watched by the ``GradientTape``; their
  gradient (one row per distinct id, already merged) is pushed as the table's
  sparse gradient. The layer's local weight matrix is never read or trained.
* The other trainable variables are the dense parameters, named by their
  Keras path; pulls land in torch buffers (in place, only shards that
  changed travel) and are assigned to the variables when they changed.
* Dtypes are kept: dense parameters, tables, rows and gradients have their
  variable's dtype (float32, float64, bfloat16 or float16) end to end.
"""

from __future__ import annotations

import numpy as np
import torch

from flextrain.job import JobSpec
from flextrain.worker.client import MasterClient
from flextrain.worker.module import FeedMetadata, Mode, ModelDef, ModelDefError
from flextrain.worker.ps_client import PSClient
from flextrain.worker.ps_trainer import PSTrainer
from flextrain.worker.tf.backend import to_numpy, to_torch
from flextrain.worker.tf.checks import require_tf
from flextrain.worker.tf.feed import feed_dataset, take
from flextrain.worker.state import WorkerState

_KERAS_OPTIMIZERS = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw", "Adagrad": "adagrad"}


def keras_optimizer_config(optimizer) -> tuple[str, dict[str, float]]:
    """(PS optimizer name, hyperparameters in the PS's torch-style names) for a Keras optimizer."""
    kind = type(optimizer).__name__
    name = _KERAS_OPTIMIZERS.get(kind)
    if name is None:
        raise ValueError(f"the parameter server cannot run the Keras optimizer {kind}; it runs "
                         f"{', '.join(f'tf.keras.optimizers.{k}' for k in _KERAS_OPTIMIZERS)}")
    cfg = optimizer.get_config()
    lr = cfg.get("learning_rate")
    if not isinstance(lr, (int, float)):
        raise ValueError(f"the parameter server needs a constant learning rate; {kind} has {lr!r}")
    for unsupported in ("clipnorm", "global_clipnorm", "clipvalue", "gradient_accumulation_steps"):
        if cfg.get(unsupported):
            raise ValueError(f"the parameter server does not support {kind}({unsupported}=...)")
    if cfg.get("use_ema"):
        raise ValueError(f"the parameter server does not support {kind}(use_ema=True)")
    hyper: dict[str, float] = {"lr": float(lr)}
    decay = float(cfg.get("weight_decay") or 0.0)
    if name == "sgd":
        if cfg.get("momentum"):
            hyper.update(momentum=float(cfg["momentum"]), nesterov=float(bool(cfg.get("nesterov"))))
    elif name in ("adam", "adamw"):
        hyper.update(beta1=float(cfg["beta_1"]), beta2=float(cfg["beta_2"]), eps=float(cfg["epsilon"]),
                     amsgrad=float(bool(cfg.get("amsgrad"))))
        if not hyper["amsgrad"]:
            del hyper["amsgrad"]
        if decay:  # Keras applies weight decay decoupled (AdamW-style) for every optimizer
            name, hyper["weight_decay"] = "adamw", decay
        decay = 0.0
    elif name == "adagrad":
        hyper.update(initial_accumulator_value=float(cfg["initial_accumulator_value"]), eps=float(cfg["epsilon"]))
    if decay:
        raise ValueError(f"the parameter server applies weight decay to {kind} as L2 (torch style), not "
                         "decoupled as Keras does; use AdamW, or put the decay in the loss")
    return name, hyper


def check_keras_ps_optimizer(model_def: ModelDef, *, lr: float | None) -> None:
    """Submission check for ParameterServer jobs of TensorFlow modules: the module's Keras optimizer
    must be one the PS runs; ModelDefError names the module, its ``optimizer`` and why."""
    model = model_def.build_model()
    optimizer = model_def.build_optimizer(model, lr)
    try:
        keras_optimizer_config(optimizer)
    except ValueError as exc:
        raise ModelDefError(f"{model_def.path}: `optimizer` returns {type(optimizer).__name__}, which "
                            f"--distribution-strategy ParameterServer cannot use: {exc}") from None


class KerasPSTrainer(PSTrainer):
    def __init__(self, *, spec: JobSpec, model_def: ModelDef, model, optimizer, client: MasterClient,
                 state: WorkerState, ps_addresses: list[str], evaluate=None) -> None:
        self.evaluate = evaluate  # see PSTrainer
        if not ps_addresses:
            raise RuntimeError("the master sent no parameter-server addresses (ParameterServer strategy)")
        self.tf = tf = require_tf()
        self.spec, self.model_def, self.model, self.client, self.state = spec, model_def, model, client, state
        try:
            self.opt_name, self.opt_hyper = keras_optimizer_config(optimizer)
        except ValueError as exc:
            raise ModelDefError(f"{model_def.path}: {exc}") from exc
        self.ps = PSClient(ps_addresses, client_id=client.worker_id, traffic=state.traffic, creds=client.creds)
        self.tape = None      # the GradientTape of the micro-batch being computed
        self.pulled_rows: list = []  # (table, distinct ids, rows) watched on that tape
        self.tables: dict[str, tuple[int, str, dict]] = {}
        table_vars = set()
        for layer in model._flatten_layers(include_self=False):
            if isinstance(layer, tf.keras.layers.Embedding):
                weights = layer.embeddings.numpy()
                init = ("zeros", {}) if not weights.any() else \
                    ("normal", {"mean": float(weights.mean()), "std": float(weights.std())})
                self.tables[layer.name] = (int(layer.output_dim), *init, tf.as_dtype(layer.embeddings.dtype).name)
                table_vars.add(id(layer.embeddings))
                object.__setattr__(layer, "call", self._lookup(layer.name, int(layer.output_dim)))
        self.variables = {v.path: v for v in model.trainable_variables if id(v) not in table_vars}
        # torch buffers mirroring the dense variables: what init_dense sends, pulls land in, pushes read .grad of
        self.dense = {n: to_torch(v.numpy()) for n, v in self.variables.items()}
        self.pulled = False

    def _lookup(self, table: str, dim: int):
        tf = self.tf

        def call(inputs, *args, **kwargs):
            ids = np.asarray(inputs.numpy() if hasattr(inputs, "numpy") else inputs, dtype=np.int64)
            distinct, inverse = self.ps.distinct(table, ids)  # grouped by PS: pulled and pushed without gathers
            rows = tf.constant(to_numpy(self.ps.pull_embedding(table, distinct)))
            if self.tape is not None:
                self.tape.watch(rows)
                self.pulled_rows.append((table, distinct, rows))
            return tf.reshape(tf.gather(rows, inverse), [*ids.shape, dim])
        return call

    def pull(self) -> None:
        if not self.dense:
            return
        _, changed = self.ps.pull_dense(0 if self.pulled else None, out=self.dense)
        self.pulled = True
        for name in changed or ():
            self.variables[name].assign(to_numpy(self.dense[name]))

    def _feed(self, records: list[bytes], meta: FeedMetadata):
        # PSTrainer.run_task drives the task; only the feed differs (tf.data, ElasticDL contract).
        return feed_dataset(self.model_def, records, Mode.TRAINING, meta)

    def _compute(self, features, labels, n: int) -> tuple[float, dict]:
        tf = self.tf
        names = list(self.variables)
        variables = [self.variables[k] for k in names]
        dense = {k: np.zeros(tuple(v.shape), to_numpy(self.dense[k]).dtype) for k, v in zip(names, variables)}
        sparse: dict[str, tuple[list, list]] = {}
        micro = self.spec.training.effective_max_micro_batch
        loss_sum = 0.0
        for lo in range(0, n, micro):
            sl = slice(lo, min(lo + micro, n))
            size = sl.stop - sl.start
            self.pulled_rows = []
            with tf.GradientTape() as tape:
                self.tape = tape
                try:
                    loss = self.model_def.loss(take(labels, sl), self.model(take(features, sl), training=True))
                finally:
                    self.tape = None
            rows = [r for _, _, r in self.pulled_rows]
            grads = tape.gradient(loss, variables + rows)
            scale = size / n
            for k, g in zip(names, grads[: len(names)]):
                if g is not None:
                    dense[k] += scale * tf.convert_to_tensor(g).numpy()
            for (table, ids, _), g in zip(self.pulled_rows, grads[len(names):]):
                if g is not None:
                    entry = sparse.setdefault(table, ([], []))
                    entry[0].append(torch.from_numpy(ids))
                    g = tf.convert_to_tensor(g).numpy()
                    entry[1].append(to_torch((scale * g).astype(g.dtype), copy=False))
            loss_sum += float(loss) * size
        self.pulled_rows = []
        for k, g in dense.items():
            self.dense[k].grad = to_torch(g, copy=False)
        return loss_sum, {t: (torch.cat(i), torch.cat(g)) for t, (i, g) in sparse.items()}
