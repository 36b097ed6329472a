"""The submission form: every option of `%%distrun` as a control, a live YAML preview with
the spec loader's own error messages, and Submit, which runs the magic's own path.

It looks like JupyterLab: controls in two columns that fold into one on a narrow page,
the preview and the problem line drawn with JupyterLab's own CSS variables (light and dark
themes)."""

from __future__ import annotations

import html
import os
from pathlib import Path

import ipywidgets as w
from IPython.display import display

from jupyter_dist.backends import available
from jupyter_dist.errors import DistrunError, SpecError
from jupyter_dist.export import FORMATS, Exported, ExportTarget, export, write
from jupyter_dist.nodes import Inventory, load_inventory
from jupyter_dist.options import SLURM_OPTIONS, LaunchOptions
from jupyter_dist.spec import JOB_TYPES, JobSpec, spec_from_dict
from jupyter_dist.widgets.live import run_with_view

_LAUNCHERS = {"pytorch": ["per_process", "torchrun"], "mpi": ["mpirun", "horovodrun"]}
# The Slurm backend's options, as the form asks for them (empty: the cluster's default).
_SLURM_HINTS = {
    "partition": "the cluster's default", "time": "e.g. 01:00:00 (the partition's default)",
    "account": "your default account", "qos": "the default QOS",
    "constraint": "node features, e.g. a100",
}  # fmt: skip


class SubmitForm(w.VBox):
    """`%distrun form`, or `jupyter_dist.widgets.form.SubmitForm()`."""

    def __init__(self, nodes_file: str | None = None, **kwargs):
        self.nodes_file = nodes_file
        try:
            self.inventory = load_inventory(nodes_file)
        except DistrunError as exc:
            self.inventory, inventory_problem = Inventory(), str(exc)
        else:
            inventory_problem = ""
        style = {"description_width": "140px"}
        self.type = w.Dropdown(options=JOB_TYPES, value="pytorch", description="type", style=style)
        self.nodes = w.BoundedIntText(value=1, min=0, max=4096, description="nodes", style=style)
        self.procs_per_node = w.BoundedIntText(
            value=1, min=0, max=1024, description="procs per node", style=style
        )
        self.launcher = w.Dropdown(options=_LAUNCHERS["pytorch"], description="launcher",
                                   style=style)  # fmt: skip
        self.worker_count = w.BoundedIntText(value=0, min=0, max=4096, style=style,
                                             description="workers (0: nodes)")  # fmt: skip
        self.ps_count = w.BoundedIntText(value=0, min=0, max=1024, description="parameter servers",
                                         style=style)  # fmt: skip
        self.chief = w.Checkbox(value=False, description="chief")
        self.evaluator = w.Checkbox(value=False, description="evaluator")
        self.env = w.Textarea(placeholder="NAME=VALUE, one a line", description="environment",
                              style=style)  # fmt: skip
        self.code = w.Text(placeholder="folder shipped to every node (optional)",
                           description="code folder", style=style)  # fmt: skip
        self.node_names = w.SelectMultiple(
            options=[n.name for n in self.inventory.nodes], description="nodes to use",
            style=style, disabled=self.inventory.is_local,
        )  # fmt: skip
        self.timeout = w.BoundedIntText(value=0, min=0, max=10**7, description="timeout (s)",
                                        style=style)  # fmt: skip
        self.name = w.Text(description="job name", style=style)
        self.script = w.Textarea(placeholder="Python code every process runs",
                                 description="code", style=style,
                                 layout=w.Layout(width="95%", height="10em"))  # fmt: skip
        self.script_path = w.Text(placeholder="or a script file to run (python FILE)",
                                  description="script file", style=style)  # fmt: skip
        self.backend = w.Dropdown(
            # "" (not None, which a Dropdown shows as no choice at all): automatic
            options=[("automatic", "")]
            + [(name, name) for name in sorted(available())],
            value="", description="backend", style=style,
        )  # fmt: skip
        self.gpus_per_node = w.BoundedIntText(value=0, min=0, max=1024, style=style,
                                              description="GPUs per node (0: none)")  # fmt: skip
        self.slurm = {
            name: self.gpus_per_node if name == "gpus_per_node" else
            w.Text(description=name, placeholder=_SLURM_HINTS.get(name, ""), style=style)
            for name in SLURM_OPTIONS
        }  # fmt: skip
        self.slurm_job = w.Text(
            description="allocation",
            style=style,
            placeholder="a job id to run in (else a new allocation)",
        )
        self.slurm_box = w.VBox([self.slurm_job, *self.slurm.values()])
        self.preview = w.HTML(layout=w.Layout(width="95%"))
        self.problem = w.HTML(_problem_html(inventory_problem))
        self.submit_button = w.Button(description="Submit", button_style="primary")
        # Export: the same job written for another scheduler (nothing runs). Three to a row,
        # each as wide as its column.
        narrow = {"style": {"description_width": "56px"}, "layout": w.Layout(width="auto")}
        self.export_format = w.Dropdown(options=list(FORMATS), value="sbatch",
                                        description="format", **narrow)  # fmt: skip
        self.export_to = w.Text(
            description="to", placeholder="a file, or a folder ending in / (this folder)",
            **narrow,
        )  # fmt: skip
        self.image = w.Text(
            description="image", placeholder="container image (kubeflow, jobset, ...)", **narrow
        )
        self.export_button = w.Button(
            description="Export", tooltip="write the job for that scheduler; runs nothing"
        )
        self.output = w.Output()
        self.last_result = None
        self.submit_button.on_click(lambda _: self.submit())
        self.export_button.on_click(lambda _: self.export())
        self._controls = [
            self.type, self.nodes, self.procs_per_node, self.launcher, self.worker_count,
            self.ps_count, self.chief, self.evaluator, self.env, self.code, self.node_names,
            self.timeout, self.name, self.script, self.script_path, self.backend,
            self.slurm_job, *self.slurm.values(),
        ]  # fmt: skip
        for control in self._controls:
            control.observe(lambda _: self.refresh(), names="value")
        self.tf_box = w.VBox([self.worker_count, self.ps_count, self.chief, self.evaluator])
        columns = w.GridBox(
            [
                w.VBox([_heading("Distribution"), self.type, self.nodes, self.procs_per_node,
                        self.launcher, self.tf_box, self.node_names]),
                w.VBox([_heading("Job"), self.name, self.timeout, self.code, self.env,
                        _heading("Where it runs"), self.backend, self.slurm_box]),
            ],
            layout=w.Layout(grid_template_columns="repeat(auto-fit, minmax(380px, 1fr))",
                            grid_gap="0 24px"),
        )  # fmt: skip
        super().__init__(
            [
                _title(), columns, _heading("Code"), self.script, self.script_path,
                _heading("Job spec (YAML)"), self.preview,
                _heading("Export to another scheduler (runs nothing)"),
                w.GridBox([self.export_format, self.export_to, self.image], layout=w.Layout(
                    grid_template_columns="repeat(auto-fit, minmax(240px, 1fr))",
                    grid_gap="0 16px", width="95%")),
                self.problem, w.HBox([self.submit_button, self.export_button]), self.output,
            ],
            layout=w.Layout(padding="4px 8px", border="var(--jp-border-width, 1px) solid "
                            "var(--jp-border-color2, #ddd)"),
            **kwargs,
        )  # fmt: skip
        self.refresh()

    def options(self) -> LaunchOptions:
        """The controls as the magic's options (one model, the same meaning)."""
        job_type = self.type.value
        tf = job_type == "tensorflow"
        env = [line.strip() for line in self.env.value.splitlines() if line.strip()]
        slurm = {}
        if self.backend.value == "slurm":  # hidden otherwise: what they hold does not count
            slurm = {name: control.value for name, control in self.slurm.items()}
            slurm = {
                name: value.strip() if isinstance(value, str) else value
                for name, value in slurm.items()
            }
        return LaunchOptions(
            type=job_type,
            nodes=len(self.node_names.value) or self.nodes.value,
            procs_per_node=None if tf else self.procs_per_node.value,
            launcher=self.launcher.value if job_type in _LAUNCHERS else None,
            worker_count=(self.worker_count.value or None) if tf else None,
            ps_count=(self.ps_count.value or None) if tf else None,
            chief=tf and self.chief.value, evaluator=tf and self.evaluator.value,
            env=env, code=self.code.value.strip() or None, timeout=self.timeout.value or None,
            name=self.name.value.strip() or None,  # dask's threads and ports: the defaults
            backend=self.backend.value or None,
            slurm_job=(self.backend.value == "slurm" and self.slurm_job.value.strip()) or None,
            **{name: value or None for name, value in slurm.items()},
        )  # fmt: skip

    def spec(self) -> JobSpec:
        """The job these controls describe, validated like a YAML file (SpecError if not)."""
        if not self.script.value.strip() and not self.script_path.value.strip():
            raise SpecError("code: write the code every process runs, or give a script file")
        spec = self.options().to_spec(self.script.value, base_dir=os.getcwd(), source="form")
        extra = {}
        if self.script_path.value.strip():
            extra["command"] = f"python {Path(self.script_path.value.strip()).expanduser()}"
        if self.node_names.value:
            extra["nodes"] = list(self.node_names.value)
        if extra:
            spec = spec_from_dict({**spec.to_dict(), **extra}, base_dir=os.getcwd(),
                                  source="form")  # fmt: skip
        return spec

    def refresh(self) -> JobSpec | None:
        """Show the YAML, or what is wrong; returns the spec when it is valid."""
        job_type = self.type.value
        self.tf_box.layout.display = None if job_type == "tensorflow" else "none"
        self.procs_per_node.disabled = job_type == "tensorflow"
        launchers = _LAUNCHERS.get(job_type, [])
        if list(self.launcher.options) != launchers:
            self.launcher.options = launchers
        self.launcher.disabled = not launchers
        self.slurm_box.layout.display = None if self.backend.value == "slurm" else "none"
        try:
            spec = self.spec()
        except DistrunError as exc:
            self.problem.value = _problem_html(str(exc))
            self.submit_button.disabled = self.export_button.disabled = True
            return None
        self.preview.value = _code_html(spec.to_yaml())
        self.problem.value = ""
        self.submit_button.disabled = self.export_button.disabled = False
        return spec

    def submit(self):
        """Run the job exactly as `%%distrun` would, its live view below the form."""
        spec = self.refresh()
        if spec is None:
            return None
        self.output.clear_output()
        with self.output:
            try:
                inventory = self.inventory if not self.inventory.is_local else None
                _, result, _ = run_with_view(spec, inventory)
            except DistrunError as exc:
                self.problem.value = _problem_html(str(exc))
                return None
            if not result.ok:
                print(result.describe())
        self.last_result = result
        return result

    def export(self) -> Exported | None:
        """Write the job as the format chosen, as `%%distrun --export` does; the files
        written and the manifest show below the form, a problem in its problem line."""
        spec = self.refresh()
        if spec is None:
            return None
        try:
            target = ExportTarget.at(
                self.export_to.value.strip() or None, stem=self.name.value.strip() or None,
                image=self.image.value.strip() or None, source="the form",
            )  # fmt: skip
            exported = export(spec, self.export_format.value, target)
            written = write(exported)
        except DistrunError as exc:
            self.problem.value = _problem_html(str(exc))
            return None
        self.output.clear_output()
        names = ", ".join(path.name for path in written)
        said = f"Wrote {names} in {exported.folder}; run it with: {exported.how_to_run()}"
        with self.output:
            display(w.VBox([w.HTML(html.escape(said)),
                            w.HTML(_code_html(exported.files[exported.manifest]))]))  # fmt: skip
        return exported


def _problem_html(message: str) -> str:
    if not message:
        return ""
    return f'<span style="color: var(--jp-error-color1, #d32f2f)">{html.escape(message)}</span>'


def _code_html(text: str) -> str:
    """Text as a code block in JupyterLab's look (the preview of the spec)."""
    style = (
        "margin: 0; padding: 6px 8px; max-height: 16em; overflow: auto;"
        "font-family: var(--jp-code-font-family, monospace);"
        "font-size: var(--jp-code-font-size, 12px);"
        "color: var(--jp-content-font-color1, inherit);"
        "background: var(--jp-cell-editor-background, #f7f7f7);"
        "border: 1px solid var(--jp-cell-editor-border-color, #e0e0e0);"
        "border-radius: var(--jp-border-radius, 2px);"
    )
    return f'<pre class="distrun-form-preview" style="{style}">{html.escape(text)}</pre>'


def _title() -> w.HTML:
    return w.HTML(
        '<div style="font-size: var(--jp-ui-font-size2, 15px); font-weight: 600;'
        'color: var(--jp-ui-font-color0, inherit); margin: 2px 0 4px">'
        "Run a distributed job</div>"
    )


def _heading(text: str) -> w.HTML:
    return w.HTML(
        '<div style="font-size: var(--jp-ui-font-size0, 11px); font-weight: 600;'
        "text-transform: uppercase; letter-spacing: 0.04em;"
        f'color: var(--jp-ui-font-color2, #666); margin: 8px 0 2px">{html.escape(text)}</div>'
    )
