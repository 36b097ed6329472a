"""`outputs:` and `${{outputs.NAME}}` (run/outputs.py): a rank writes its result where the
command says; on local nodes that is the store's job folder, from SSH nodes it is copied
there when the job ends; `inspect` says where, and all of it is private."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from helpers import not_private, run_cli

from jupyter_dist.run.launch import run
from jupyter_dist.spec import parse_spec

# Every rank writes its own file into the folder output; rank 0 the file output too. The
# umask most machines have: the files are made private after, not by luck.
WRITES = (
    "command: >-\n"
    "  python -c \"import os, sys; os.umask(0o022); r = os.environ['RANK'];\n"
    "  open(os.path.join(sys.argv[1], 'weights-' + r + '.txt'), 'w').write('rank ' + r);\n"
    "  r == '0' and open(sys.argv[2], 'w').write('loss 0.5')\"\n"
    "  ${{outputs.model}} ${{outputs.summary}}\n"
    "outputs:\n  model: {type: uri_folder}\n  summary: {type: uri_file}\n"
    "resources: {instance_count: 2}\n"
)


def _inspected(store, job_id: str) -> list[str]:
    shown = run_cli("inspect", job_id, store=store, env={**os.environ, "COLUMNS": "300"})
    assert shown.returncode == 0, shown.stderr
    return [line.removeprefix("Output: ") for line in shown.stdout.splitlines()
            if line.startswith("Output: ")]  # fmt: skip


@pytest.mark.slow
def test_outputs_on_local_nodes_are_in_the_store_where_inspect_says(store):
    result = run(parse_spec(WRITES), store=store)
    assert result.ok, result.describe()
    job = store.get(result.job_id).path
    model = job / "outputs" / "model"
    assert sorted(p.name for p in model.iterdir()) == ["weights-0.txt", "weights-1.txt"]
    assert (job / "outputs" / "summary").read_text() == "loss 0.5"
    assert _inspected(store, result.job_id) == [
        f"outputs.model: {model}",
        f"outputs.summary: {job / 'outputs' / 'summary'}",
    ]
    assert not_private(job) == []


def test_outputs_on_ssh_nodes_are_copied_into_the_store(ssh_nodes, store, tmp_path):
    result = run(parse_spec(WRITES), store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert result.ok, result.describe()
    job = store.get(result.job_id).path
    for rank, node in enumerate(("node0", "node1")):
        copied = job / "outputs" / node / "model" / f"weights-{rank}.txt"
        assert copied.read_text() == f"rank {rank}"
    assert (job / "outputs" / "node0" / "summary").read_text() == "loss 0.5"
    assert not (job / "outputs" / "node1" / "summary").exists()  # rank 1 wrote none
    said = _inspected(store, result.job_id)
    assert said[:2] == [
        f"outputs.model: outputs/model in the job's folder on each node; copied into "
        f"{job / 'outputs'}/<node>/model when the job ends",
        f"outputs.summary: outputs/summary in the job's folder on each node; copied into "
        f"{job / 'outputs'}/<node>/summary when the job ends",
    ]
    assert f"outputs.model: 1 file(s) from node1 in {job / 'outputs' / 'node1' / 'model'}" in said
    assert not_private(job) == []
    for node in ssh_nodes.nodes:  # the nodes' own copies: private too, once the rank ended
        assert not_private(Path(node.workdir) / result.job_id) == []


def test_an_output_with_its_own_path_is_written_there(store, tmp_path):
    target = tmp_path / "shared" / "model"
    spec = parse_spec(
        "command: echo $RANK > ${{outputs.model}}/r$RANK\n"
        f"outputs: {{model: {{path: {target}}}}}\nresources: {{instance_count: 2}}\n"
    )
    result = run(spec, store=store)
    assert result.ok, result.describe()
    assert sorted(p.name for p in target.iterdir()) == ["r0", "r1"]
    assert _inspected(store, result.job_id) == [
        f"outputs.model: {target} on each node (the spec's path)"
    ]


@pytest.mark.parametrize("fmt", ["azureml", "sbatch"])
def test_exports_keep_the_outputs(fmt, tmp_path):
    from jupyter_dist.export import export
    from jupyter_dist.export.target import ExportTarget

    exported = export(
        parse_spec(WRITES),
        fmt,
        ExportTarget.at(tmp_path / "out/", image="img" if fmt == "azureml" else None),
    )
    manifest = exported.files[exported.manifest]
    if fmt == "azureml":  # Azure ML gives the path itself
        assert "${{outputs.model}}" in manifest and "type: uri_folder" in manifest
    else:  # made before the command runs, in the job's folder
        assert 'mkdir -p -- "${DISTRUN_JOB_DIR}"/outputs/model' in manifest
        assert "${DISTRUN_JOB_DIR}/outputs/model" in manifest


def test_an_azure_ml_location_is_kept_for_azure_and_the_job_folder_used_here(store, tmp_path):
    """Azure ML job files load unchanged: an output at an Azure datastore (and Azure's other
    output types) runs into the job's folder here, and goes back to Azure as written."""
    from jupyter_dist.export import export
    from jupyter_dist.export.target import ExportTarget

    location = "azureml://datastores/workspaceblobstore/paths/model"
    spec = parse_spec(
        "command: echo $RANK > ${{outputs.model}}/r$RANK\n"
        f"outputs: {{model: {{type: mlflow_model, path: {location}, mode: rw_mount}}}}\n"
    )
    result = run(spec, store=store)
    assert result.ok, result.describe()
    job = store.get(result.job_id).path
    assert (job / "outputs" / "model" / "r0").read_text() == "0\n"
    exported = export(spec, "azureml", ExportTarget.at(tmp_path / "az/", image="img"))
    manifest = exported.files[exported.manifest]
    assert f"path: {location}" in manifest and "${{outputs.model}}" in manifest
    assert "outputs.model.path" not in manifest  # nothing left out


def test_a_copy_from_ssh_nodes_goes_in_pieces_and_stops_at_its_limit(
    ssh_nodes, store, tmp_path, monkeypatch
):
    """5 MiB of data (two pieces), a small file and a 64 MiB sparse file, with 8 MiB
    allowed from each node: the first two arrive whole, the third stays on the node and is
    named with its path; nothing half-written is left in the store."""
    monkeypatch.setenv("DISTRUN_OUTPUTS_LIMIT_MB", "8")
    spec = parse_spec(
        "command: >-\n"
        '  python -c "import os, sys; d = sys.argv[1];\n'
        "  open(os.path.join(d, 'a-data.bin'), 'wb').write(bytes(range(256)) * 20480);\n"
        "  open(os.path.join(d, 'b-small.txt'), 'w').write('rank ' + os.environ['RANK']);\n"
        "  open(os.path.join(d, 'c-sparse.bin'), 'wb').truncate(64 << 20)\"\n"
        "  ${{outputs.model}}\n"
        "outputs:\n  model: {type: uri_folder}\nresources: {instance_count: 2}\n"
    )
    result = run(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    assert result.ok, result.describe()
    job = store.get(result.job_id).path
    said = _inspected(store, result.job_id)
    for rank, node in enumerate(ssh_nodes.nodes):
        copied = job / "outputs" / node.name / "model"
        assert sorted(p.name for p in copied.iterdir()) == ["a-data.bin", "b-small.txt"]
        assert (copied / "a-data.bin").read_bytes() == bytes(range(256)) * 20480
        assert (copied / "b-small.txt").read_text() == f"rank {rank}"
        left = Path(node.workdir) / result.job_id / "outputs" / "model" / "c-sparse.bin"
        assert left.stat().st_size == 64 << 20  # still there, where the line says
        assert (
            f"outputs.model: left on {node.name}, past the 8.0 MiB a job copies from each "
            f"node (DISTRUN_OUTPUTS_LIMIT_MB): {left} (64.0 MiB)"
        ) in said, said
    assert not_private(job) == []


def test_a_long_copy_says_how_far_it_is_follows_no_growth_and_stops_when_told(
    store, tmp_path, monkeypatch
):
    """The copy loop itself, from a node that does not see the store (this machine's files,
    read by the local backend as any node's): a file that grows while it is copied is
    copied as it was listed, the progress is said, and a cancel ends the copy with nothing
    half written and the rest named."""
    from dataclasses import replace

    from jupyter_dist.backends.local import LocalBackend
    from jupyter_dist.nodes import Inventory
    from jupyter_dist.plan import plan
    from jupyter_dist.run import outputs

    monkeypatch.setattr(outputs, "PIECE_BYTES", 1 << 20)
    monkeypatch.setattr(outputs, "PROGRESS_EVERY_S", 0)
    spec = parse_spec(WRITES.replace("instance_count: 2", "instance_count: 1"))
    (node,) = [replace(n, shares_files=False, workdir=str(tmp_path / "far"))
               for n in Inventory().select(1, None, workdir=tmp_path)]  # fmt: skip
    job_plan = plan(spec, [node], "job1", {"master": 1234})
    folder = tmp_path / "far" / "job1" / "outputs" / "model"
    folder.mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"a" * (3 << 20))
    (folder / "b.bin").write_bytes(b"b" * (3 << 20))
    record = tmp_path / "record"
    said_progress: list[str] = []

    def grows(text: str) -> None:  # each piece: the file being copied grows by one more
        said_progress.append(text)
        with open(folder / "a.bin", "ab") as handle:
            handle.write(b"x" * (1 << 20))

    said = outputs.collect_outputs(job_plan, [node], LocalBackend(), record, progress=grows)
    copied = record / "outputs" / node.name / "model"
    assert (copied / "a.bin").read_bytes() == b"a" * (3 << 20)  # as listed, not as grown
    assert said_progress[0] == f"copying outputs from {node.name}: 1.0 MiB of 6.0 MiB"
    assert said == [f"outputs.model: 2 file(s) from {node.name} in {copied}"]

    stop = threading.Event()
    again = tmp_path / "again"
    said = outputs.collect_outputs(
        job_plan, [node], LocalBackend(), again, stop=stop, progress=lambda _text: stop.set()
    )
    assert said == [
        "outputs: the copy was cancelled; what it had not copied is on the nodes, "
        f"{tmp_path / 'far' / 'job1' / 'outputs'} on {node.name}"
    ]
    assert [p.name for p in (again / "outputs" / node.name / "model").iterdir()] == []


def test_a_cancel_during_a_long_copy_from_ssh_nodes_ends_it(
    ssh_nodes, store, tmp_path, monkeypatch
):
    """A 768 MiB file on each node (sparse there, all of it sent): while it is copied, the
    job's outcome is already stored, `jobs` says how far the copy is, and `cancel` ends the
    copy at once, leaving nothing half written and naming where the rest is."""
    from jupyter_dist.run import outputs
    from jupyter_dist.run.launch import launch

    monkeypatch.setattr(outputs, "PROGRESS_EVERY_S", 0.5)
    spec = parse_spec(
        "command: >-\n"
        "  python -c \"import sys; open(sys.argv[1] + '/big.bin', 'wb').truncate(768 << 20)\"\n"
        "  ${{outputs.model}}\n"
        "outputs:\n  model: {type: uri_folder}\nresources: {instance_count: 2}\n"
    )
    job = launch(spec, store=store, inventory=ssh_nodes.load_inventory(tmp_path))
    record = store.get(job.job_id)
    deadline = time.monotonic() + 120
    while "copying outputs from" not in str(record.status().get("message")):
        assert job.wait(0.2) is None, "the copy ended before it said how far it was"
        assert time.monotonic() < deadline, record.status()
    assert record.status()["state"] == "succeeded"  # stored before the copy
    cancelled = run_cli("cancel", job.job_id, store=store)
    assert cancelled.returncode == 0, cancelled.stderr
    result = job.wait(30)
    assert result is not None and result.state == "succeeded", "the copy was not cancelled"
    said = record.status()["outputs_copied"]
    assert said[-1].startswith("outputs: the copy was cancelled; what it had not"), said
    assert not any(p.name.endswith(".tmp") for p in record.path.rglob("*")), "half written"
    assert not (record.path / "outputs" / "node1" / "model" / "big.bin").exists()
    assert record.status()["message"] is None or "copying" not in record.status()["message"]
