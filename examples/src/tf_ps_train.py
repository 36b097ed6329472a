"""ParameterServerStrategy: the chief is the coordinator; workers and parameter servers
serve until the job stops them.

Variables live on the parameter servers; the coordinator schedules training steps onto
whichever worker is free. Every task runs this same script and picks its part from
TF_CONFIG. The chief prints one line `RESULT {json}` with what the tests check."""

from __future__ import annotations

import json
import os
import socket

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter

import tensorflow as tf

STEPS, LEARNING_RATE = 40, 0.1


def serve(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> None:
    """A worker or parameter server: run the TensorFlow server until stopped."""
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"{resolver.task_type} {resolver.task_id} serving on {socket.gethostname()}", flush=True)
    server.join()


def coordinate(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> None:
    """The chief: create the variables on the parameter servers, schedule steps on workers."""
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        weights = tf.Variable([[0.0], [0.0]])
        bias = tf.Variable([0.0])
        workers = resolver.cluster_spec().num_tasks("worker")
        steps_per_worker = tf.Variable(tf.zeros([workers], tf.int64))  # who ran each step

    @tf.function
    def train_step():
        # y = 2*x0 - x1 + 0.5 on a fresh random batch, drawn on the worker.
        x = tf.random.uniform((64, 2))
        y = tf.matmul(x, [[2.0], [-1.0]]) + 0.5
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, weights) + bias - y) ** 2)
        grad_w, grad_b = tape.gradient(loss, [weights, bias])
        weights.assign_sub(LEARNING_RATE * grad_w)
        bias.assign_sub(LEARNING_RATE * grad_b)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        steps_per_worker.assign_add(tf.one_hot(worker, workers, dtype=tf.int64))
        return loss

    losses = [coordinator.schedule(train_step) for _ in range(STEPS)]
    coordinator.join()
    print(f"chief: first loss {losses[0].fetch():.4f}, last {losses[-1].fetch():.4f}", flush=True)
    report = {
        "role": "chief",
        "host": socket.gethostname(),
        "workers": workers,
        "ps": resolver.cluster_spec().num_tasks("ps"),
        "steps_per_worker": [int(n) for n in steps_per_worker.numpy()],
        "variable_device": weights.device,
        "first_loss": float(losses[0].fetch()),
        "last_loss": float(losses[-1].fetch()),
    }
    print("RESULT " + json.dumps(report), flush=True)


def main() -> None:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        serve(resolver)
    else:
        coordinate(resolver)


if __name__ == "__main__":
    main()
