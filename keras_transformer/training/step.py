"""The training step that `kt-train` runs through `fit`: `TrainingModel` wraps a Transformer.

The paper's model (`keras_transformer.Transformer`) stays a plain `keras.Model`: compiled
with `LabelSmoothedCrossEntropy` it trains with Keras' own `fit` (the notebooks do this).
`TrainingModel` adds what multi-device training needs on top:

- the loss of every step is the sum over real target tokens divided by the real tokens of
  the *global* batch (all replicas), so N replicas or k accumulation steps give exactly
  the one-device update on the same global batch (Keras' default divides per replica);
- `accum_steps` micro-batches per update (Keras 3's `gradient_accumulation_steps` fails
  under MirroredStrategy);
- the step all-reduces the gradients, with float16's loss flag (see `_apply_reduced`);
- `data_position` counts the batches consumed (skipped float16 steps included);
  `data_next` is the stream position (pass and batch in the pass) of the next batch to
  read, taken from the positions that training batches carry, which is where a resumed run
  restarts its data (multi-worker: `replica_next`, the next position of every replica, as
  each worker reads a stream of its own; `input_workers`, their number: training.layout
  resumes under another layout).

The workarounds for Keras internals that the step needs (`_apply_reduced`,
`_maybe_symbolic_build`, the reshape in `_record_loss`) are here, each with the reason.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_transformer.errors import KerasTransformerError
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.training.collective import all_reduce_sum, step_sums

NONFINITE = "nonfinite"  # float16 steps: 1.0 when the step's loss was NaN/Inf on a replica
GRADIENTS_ALL_REDUCE = "gradients_all_reduce"  # the name scope of the step's all-reduce


class TrainingModel(keras.Model):
    """`fit` driver for a sequence-to-sequence model trained with a token-level loss.

    Args:
        model: a built `Transformer` (anything mapping `(source_ids, target_in_ids)` to
            (B, T, V) logits).
        accum_steps: k micro-batches per update: batch rows i, i+k, i+2k, ... form
            micro-batch i; their gradients are summed before one optimizer step.

    Compile with `loss=LabelSmoothedCrossEntropy(...)`. Datasets yield
    `((source_ids (B, S), target_in_ids (B, T)), target_out_ids (B, T))`, optionally with
    a third element, the (B,) int64 stream positions of `data.training_batches`.
    """

    def __init__(self, model: keras.Model, *, accum_steps: int = 1, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(accum_steps, int) or accum_steps < 1:
            raise KerasTransformerError(
                f"accum_steps must be a positive integer, got {accum_steps!r}"
            )
        self.transformer = model
        self.accum_steps = accum_steps
        self.data_position, self.data_next = (
            self.add_weight(
                shape=(),
                dtype="int64",
                initializer="zeros",
                trainable=False,
                aggregation="only_first_replica",
                name=name,
            )
            for name in ("data_position", "data_next")
        )
        # multi-worker: every worker reads a stream of its own (`streams.worker_streams`), so
        # each replica's next position is kept (None elsewhere)
        self.replica_next = None
        strategy = tf.distribute.get_strategy()
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            self.replica_next = self.add_weight(
                shape=(strategy.num_replicas_in_sync,),
                dtype="int64",
                initializer="zeros",
                trainable=False,
                aggregation="only_first_replica",
                name="replica_next",
            )
            # the number of worker streams those positions belong to (training.layout)
            workers = strategy.num_replicas_in_sync // len(strategy.extended.worker_devices)
            self.input_workers = self.add_weight(
                shape=(),
                dtype="int64",
                initializer=keras.initializers.Constant(workers),
                trainable=False,
                aggregation="only_first_replica",
                name="input_workers",
            )
        if not model.built:
            model.build()
        self.built = True

    def call(self, inputs, training=None):
        return self.transformer(inputs, training=training)

    def _token_loss(self) -> LabelSmoothedCrossEntropy:
        if not isinstance(self.loss, LabelSmoothedCrossEntropy):
            raise KerasTransformerError(
                "TrainingModel needs compile(loss=keras_transformer.LabelSmoothedCrossEntropy()), "
                f"got {self.loss!r}"
            )
        return self.loss

    # -- the step ---------------------------------------------------------------------------

    def train_step(self, data):
        (source_ids, target_in_ids), target_out_ids = data[:2]
        local_tokens = tf.reduce_sum(tf.cast(tf.not_equal(target_out_ids, 0), tf.float32))
        # one all-reduce: the global token count and every replica's last stream position
        global_tokens, positions = step_sums(local_tokens, data[2] if len(data) > 2 else None)
        grads, loss_sum = self.compute_gradients(
            source_ids, target_in_ids, target_out_ids, tf.maximum(global_tokens, 1.0)
        )
        scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        finite = tf.math.is_finite(loss_sum)
        # one all-reduce: the gradients and, float16, "the loss was non-finite" (> 0 when it
        # was on any replica; see `_apply_reduced` for the gradients' finite check)
        flags = [tf.cast(tf.logical_not(finite), grads[0].dtype)] if scaled else []
        with tf.name_scope(GRADIENTS_ALL_REDUCE):
            reduced = list(all_reduce_sum([*grads, *flags]))
        self._apply_reduced(reduced[: len(grads)])
        self.data_position.assign_add(1)
        if positions is not None:  # stream positions of the rows (data.training_batches)
            self.data_next.assign(tf.reduce_max(positions) + 1)
            if self.replica_next is not None:
                self.replica_next.assign(positions + 1)
        if not scaled:
            return self._pack_logs(self._record_loss(loss_sum, local_tokens))
        # float16: a non-finite loss (its step skipped by the loss scaler) stays out of the
        # epoch's mean loss, and the step says it was non-finite on some replica
        results = self._record_loss(
            tf.where(finite, loss_sum, 0.0), tf.where(finite, local_tokens, 0.0)
        )
        flag = tf.reshape(tf.cast(reduced[-1] > 0.0, tf.float32), results["loss"].shape)
        return self._pack_logs({**results, NONFINITE: flag})

    def compile(self, *args, jit_compile=False, **kwargs):
        """Keras' compile; `jit_compile=True` compiles each micro-batch's forward and
        backward pass with XLA (`micro_batch_gradients`), not the whole step.

        Keras' own `jit_compile` puts the whole distributed step, all-reduce included, in one
        XLA cluster: under MirroredStrategy that fails at the first step ("Trying to access
        resource ... located in device CPU:1 from device CPU:0", keras-team/keras#20763), and
        XLA drops the control dependencies that run the micro-batches one after the other,
        so k micro-batches peak like one k-times-larger batch. Compiling the per-replica
        forward and backward pass only (as OpenNMT-tf does) keeps the all-reduce and the
        accumulation loop in TensorFlow's graph: one XLA program per micro-batch shape,
        launched k times in sequence.
        """
        self.xla_micro_batches = jit_compile is True
        self._compiled_micro_batch = None
        super().compile(*args, jit_compile=False, **kwargs)

    def micro_batch_gradients(self, src, tgt_in, tgt_out, global_tokens):
        """(gradients, loss sum, logits) of one micro-batch: the loss divided by the global
        token count and multiplied by the loss scale."""
        with tf.GradientTape() as tape:
            logits = self.transformer((src, tgt_in), training=True)
            loss_sum, _ = self._token_loss().sum_and_count(tgt_out, logits)
            scaled = self.optimizer.scale_loss(loss_sum / global_tokens)
        grads = tape.gradient(scaled, self.transformer.trainable_variables)
        # dense gradients: the embedding's IndexedSlices (one per lookup) cannot be
        # all-reduced across replicas whose batches differ in shape
        return [tf.convert_to_tensor(g) for g in grads], loss_sum, logits

    def _micro_batch_fn(self):
        if not getattr(self, "xla_micro_batches", False):
            return self.micro_batch_gradients
        if self._compiled_micro_batch is None:
            self._compiled_micro_batch = tf.function(
                self.micro_batch_gradients, jit_compile=True, reduce_retracing=True
            )
        return self._compiled_micro_batch

    def compute_gradients(self, source_ids, target_in_ids, target_out_ids, global_tokens):
        """Summed gradients of this replica's micro-batches, loss already divided by the
        global token count and multiplied by the loss scale; returns (grads, loss sum)."""
        micro_batch = self._micro_batch_fn()
        k = self.accum_steps
        summed, loss_total = None, 0.0
        for i in range(k):  # a static loop: micro-batch i takes rows i, i+k, i+2k, ...
            rows = slice(None) if k == 1 else slice(i, None, k)
            src, tgt_in, tgt_out = source_ids[rows], target_in_ids[rows], target_out_ids[rows]
            if summed is not None:
                # one micro-batch at a time: this one starts after the last one's gradients,
                # so only one micro-batch's activations are alive (the point of accumulating;
                # with XLA each micro-batch is one compiled program, launched in this order)
                with tf.control_dependencies(summed):
                    src, tgt_in, tgt_out = (tf.identity(t) for t in (src, tgt_in, tgt_out))
            grads, loss_sum, logits = micro_batch(src, tgt_in, tgt_out, global_tokens)
            summed = grads if summed is None else [a + b for a, b in zip(summed, grads)]
            loss_total += loss_sum
            self._update_token_metrics(tgt_out, logits)
        return summed, loss_total

    def test_step(self, data):
        (source_ids, target_in_ids), target_out_ids = data[:2]
        logits = self.transformer((source_ids, target_in_ids), training=False)
        loss_sum, count = self._token_loss().sum_and_count(target_out_ids, logits)
        self._update_token_metrics(target_out_ids, logits)
        return self._record_loss(loss_sum, count)

    def _update_token_metrics(self, y_true, logits):
        for metric in self.metrics:
            if metric.name != "loss":
                metric.update_state(y_true, logits)

    def _record_loss(self, loss_sum, tokens):
        for metric in self.metrics:
            if metric.name == "loss":  # per-token mean, token-weighted across replicas
                metric.update_state(loss_sum / tf.maximum(tokens, 1.0), sample_weight=tokens)
        results = self.get_metrics_result()
        if isinstance(self.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            # Keras workaround: keras/src/backend/tensorflow/trainer.py reduces the step
            # outputs of multi-worker runs with `concat` + reduce(MEAN, axis=0), which needs a
            # leading axis; give each scalar one, the reduction removes it again.
            results = tf.nest.map_structure(lambda v: tf.reshape(v, [1]), results)
        return results

    def _pack_logs(self, results):
        """Multi-worker: the step's logs as one (1, n) tensor, so that Keras' reduction of
        the step outputs across workers (keras/src/backend/tensorflow/trainer.py:
        reduce(MEAN, axis=0), two collectives per output) costs two collectives, not two per
        log; `make_train_function` names them again. Elsewhere Keras reduces locally."""
        if not isinstance(self.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return results
        self._log_names = list(results)
        values = [tf.reshape(tf.cast(results[n], tf.float32), [1]) for n in self._log_names]
        return {"packed_logs": tf.concat(values, axis=0)[tf.newaxis]}

    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return self.train_function
        super().make_train_function(force=force)
        if isinstance(self.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            packed = self.train_function

            def unpacked(iterator):
                values = tf.reshape(packed(iterator)["packed_logs"], [-1])
                return {name: values[i] for i, name in enumerate(self._log_names)}

            self.train_function = unpacked
        return self.train_function

    # -- Keras workarounds ------------------------------------------------------------------

    def _apply_reduced(self, grads):
        """The optimizer's update with gradients the step has all-reduced already.

        Keras workaround: Keras' optimizer sums the gradients it is given over the replicas
        (keras/src/backend/tensorflow/optimizer.py: `_all_reduce_sum_gradients`, called by
        `_backend_update_step`, after the loss scaler's finite check and unscaling). The step
        reduces them first, in one all-reduce with float16's loss flag, so the check sees
        the summed gradients, the same on every replica and non-finite when any replica's
        are (`LossScaleOptimizer._tf_apply` checks replica 0's under MirroredStrategy, each
        replica its own under MultiWorkerMirroredStrategy), and the optimizer's reduction is
        made the identity (on the wrapped optimizer under loss scaling). The sum divided by
        the loss scale, a power of two, is the sum of the divided gradients bit for bit.
        Keras' `clipnorm` (`paper_optimizer`'s; kt-train sets none) clipped each replica's
        gradients before the sum, now the sum, as on one device.
        """
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        inner._all_reduce_sum_gradients = _already_reduced  # test_step.py counts the reduces
        self.optimizer.apply(grads, self.transformer.trainable_variables)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras workaround: keras/src/backend/tensorflow/trainer.py builds the model under a
        # strategy from a batch it reads with a first iterator of the dataset, which it then
        # throws away: the training stream was built and read twice per `fit` (the skip to
        # the resume position paid twice, the dropped-pairs count doubled), and its MEAN
        # over replicas fails when replicas hold different numbers of rows. The dataset's
        # element spec (shapes and dtypes) is all the symbolic build needs.
        if iterator is not None and self._distribute_strategy is not None:
            # not the stream positions: Keras would take them for sample weights
            data_batch = tuple(_local_spec(s) for s in _element_spec(iterator)[:2])
        return super()._maybe_symbolic_build(data_batch=data_batch)


def _already_reduced(grads_and_vars):
    return list(grads_and_vars)


def _element_spec(iterator):
    """The element spec of the dataset behind a Keras epoch iterator, without iterating it."""
    dataset = iterator.data_adapter.get_tf_dataset()
    return dataset.element_spec


def _local_spec(spec):
    """One replica's spec (a distributed dataset's per-replica specs hold one per replica)."""
    return tf.nest.map_structure(
        lambda s: s._value_specs[0] if hasattr(s, "_value_specs") else s, spec
    )


__all__ = ["TrainingModel", "all_reduce_sum"]
