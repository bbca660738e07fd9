"""TensorFlow / Keras workers (optional: ``pip install 'flextrain[tensorflow]'``).

The framework-neutral round protocol (``flextrain.worker.trainer``) and the
PS task loop drive Keras models through these modules:

* ``checks``  - import TensorFlow or say how to install it; check the model and optimizer.
* ``feed``    - the ElasticDL ``feed(dataset, mode, metadata)`` contract over ``tf.data``.
* ``backend`` - :class:`KerasBackend`: gradients into the shared flat all-reduce buffer,
  optimizer steps, state for broadcast and checkpoints.
* ``ps``      - :class:`KerasPSTrainer`: Keras under the ParameterServer strategy.
* ``evaluation`` - per-sample metric sums of a Keras model over an evaluation task.

Nothing here is imported unless the job's module is a TensorFlow module.
"""
