"""`outputs:` and `${{outputs.NAME}}` (run/outputs.py): a rank writes its result where the
command says; on local nodes that is the store's job folder, from SSH nodes it is copied
there when the job ends; `inspect` says where, and all of it is private."""

from __future__ import annotations

import os
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
