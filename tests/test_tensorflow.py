"""Real TensorFlow (tensorflow-cpu) across two real sshd nodes."""

from __future__ import annotations

import json
import textwrap

import pytest
from helpers import EXAMPLES, result_reports, run_cli

from jupyter_dist.describe import tf_configs
from jupyter_dist.plan import LaunchPlan
from jupyter_dist.run.launch import run
from jupyter_dist.spec import load_spec, parse_spec

pytestmark = pytest.mark.tensorflow


@pytest.mark.ssh
def test_multi_worker_mirrored_custom_loop_across_two_ssh_nodes(ssh_nodes, store, tmp_path):
    spec = parse_spec(
        textwrap.dedent(f"""\
        code: {EXAMPLES / "src"}
        command: python tf_mwms_train.py
        environment_variables: {{OMP_NUM_THREADS: '1'}}
        resources: {{instance_count: 2}}
        distribution: {{type: tensorflow, worker_count: 2}}
        """)
    )
    result = run(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert result.ok, result.describe()
    reports = result_reports(store, result.job_id)
    assert sorted(reports) == [0, 1]
    assert [reports[i]["host"] for i in (0, 1)] == ["node0", "node1"]  # one worker a node
    assert {r["workers"] for r in reports.values()} == {2}
    assert {r["allreduce"] for r in reports.values()} == {3.0}  # replica ids 1 + 2
    weights = {json.dumps(r["weights"]) for r in reports.values()}
    assert len(weights) == 1, f"workers disagree: {weights}"  # averaged gradients
    assert json.loads(weights.pop()) != [0.0, 0.0, 0.0]  # and they did train
    plan = LaunchPlan.from_dict(store.get(result.job_id).plan())
    shown = tf_configs(plan)
    assert "TF_CONFIG of worker 0" in shown and "TF_CONFIG of worker 1" in shown
    assert ssh_nodes.job_processes(result.job_id) == []


@pytest.mark.ssh
def test_parameter_server_strategy_across_two_ssh_nodes(ssh_nodes, store, tmp_path):
    """A chief coordinator, 2 workers and 1 ps (the example YAML, on the sshd nodes): the
    variables live on the ps, both workers run steps, and the serving tasks are stopped
    once the chief is done."""
    spec = load_spec(EXAMPLES / "tensorflow_ps.yml")
    result = run(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert result.ok, result.describe()
    chief = result_reports(store, result.job_id)["chief"]
    assert chief["host"] == "node0" and (chief["workers"], chief["ps"]) == (2, 1)
    assert chief["variable_device"].startswith("/job:ps/replica:0/task:0")
    assert sum(chief["steps_per_worker"]) == 40
    assert min(chief["steps_per_worker"]) > 0, chief  # both workers took steps
    assert chief["last_loss"] < chief["first_loss"]
    states = {p.name: (p.state, p.signal) for p in result.processes}
    assert states == {
        "chief-0": ("succeeded", None), "worker-0": ("stopped", "SIGTERM"),
        "worker-1": ("stopped", "SIGTERM"), "ps-0": ("stopped", "SIGTERM"),
    }  # fmt: skip
    serving = {line.text for key in ("worker-0", "worker-1", "ps-0")
               for line in store.get(result.job_id).iter_log(key, "stdout")}  # fmt: skip
    assert serving == {"worker 0 serving on node1", "worker 1 serving on node0",
                       "ps 0 serving on node1"}  # fmt: skip
    shown = tf_configs(LaunchPlan.from_dict(store.get(result.job_id).plan()))
    for task in ("chief", "worker 0", "worker 1", "ps 0"):
        assert f"TF_CONFIG of {task}" in shown
    assert ssh_nodes.job_processes(result.job_id) == []


@pytest.mark.ssh
def test_a_failing_tensorflow_worker_stops_the_job_with_the_root_cause(ssh_nodes, store, tmp_path):
    script = tmp_path / "code" / "fail.py"
    script.parent.mkdir()
    script.write_text(
        textwrap.dedent("""\
        import json, os, time
        import tensorflow as tf
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
            raise RuntimeError("worker 1 ran out of patience")
        time.sleep(300)
        """)
    )
    spec = parse_spec(
        textwrap.dedent(f"""\
        code: {script.parent}
        command: python fail.py
        resources: {{instance_count: 2}}
        distribution: {{type: tensorflow, worker_count: 2}}
        """)
    )
    result = run(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path), grace_period=3)
    assert result.state == "failed"
    cause = result.root_cause
    assert cause.label == "worker 1" and cause.node == ssh_nodes.nodes[1].name
    assert "RuntimeError: worker 1 ran out of patience" in cause.stderr_tail[-1]
    assert cause.stopped == ["worker 0"]
    assert ssh_nodes.job_processes(result.job_id) == []


@pytest.mark.slow
def test_the_tensorflow_example_runs_as_it_is_on_local_nodes(store):
    done = run_cli("run", str(EXAMPLES / "tensorflow_mwms.yml"), store=store, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = result_reports(store, store.jobs()[0].job_id)
    assert sorted(reports) == [0, 1]
    assert len({json.dumps(r["weights"]) for r in reports.values()}) == 1
