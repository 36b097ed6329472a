"""MultiWorkerMirroredStrategy with a custom training loop: every worker trains on its own
shard, gradients are averaged across workers, so every worker ends with the same weights.

(Keras 3 `model.fit` under this strategy fails; a custom loop is the reliable path.)
Each worker prints one line `RESULT {json}` with what the tests check."""

from __future__ import annotations

import json
import os
import socket

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter

import tensorflow as tf

STEPS, LEARNING_RATE = 30, 0.1


def main() -> None:
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    mean = tf.VariableAggregation.MEAN  # an update made on every replica is averaged
    with strategy.scope():
        weights = tf.Variable([[0.0], [0.0]], aggregation=mean)
        bias = tf.Variable([0.0], aggregation=mean)

    # Each worker's own shard of y = 2*x0 - x1 + 0.5.
    x = tf.random.stateless_uniform((64, 2), seed=(task["index"], 7))
    y = tf.matmul(x, [[2.0], [-1.0]]) + 0.5

    @tf.function
    def train_step():
        def replica_step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((tf.matmul(x, weights) + bias - y) ** 2)
            grad_w, grad_b = tape.gradient(loss, [weights, bias])
            ctx = tf.distribute.get_replica_context()
            grad_w, grad_b = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, [grad_w, grad_b])
            weights.assign_sub(LEARNING_RATE * grad_w)
            bias.assign_sub(LEARNING_RATE * grad_b)
            return loss

        return strategy.run(replica_step)

    @tf.function
    def sum_of_replica_ids():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            one_based = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, one_based)

        return strategy.run(replica_fn)

    for step in range(STEPS):
        loss = train_step()
        if step % 10 == 0:
            print(f"worker {task['index']} step {step} loss {float(loss):.4f}", flush=True)
    report = {
        "rank": task["index"],
        "host": socket.gethostname(),
        "workers": strategy.num_replicas_in_sync,
        "allreduce": float(sum_of_replica_ids()),
        "weights": [round(float(v), 5) for v in tf.reshape(weights, [-1])]
        + [round(float(bias[0]), 5)],
    }
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
