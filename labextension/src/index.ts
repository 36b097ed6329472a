/**
 * jupyter-dist in JupyterLab: a sidebar of nodes and jobs, a main-area log viewer, and
 * commands (palette and notebook toolbar) to insert a %%distrun cell or open the form.
 */

import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, ToolbarButton } from '@jupyterlab/apputils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import {
  INotebookModel,
  INotebookTracker,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';

import { DistrunApi, serverRequester } from './api';
import { JobLogViewer } from './logviewer';
import { DistrunSidebar } from './sidebar';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">
<g class="jp-icon3" fill="#616161"><circle cx="5" cy="6" r="2.5"/><circle cx="19" cy="6" r="2.5"/>
<circle cx="5" cy="18" r="2.5"/><circle cx="19" cy="18" r="2.5"/><circle cx="12" cy="12" r="3"/>
<path d="M6.6 7.2 10 10.4l-.9 1L5.7 8.2zM17.4 7.2l.9 1-3.4 3.2-.9-1zM10 13.6l.9 1-3.4 3.2-.9-1zM14 13.6l3.4 3.2-.9 1-3.4-3.2z"/></g></svg>`;

export const distrunIcon = new LabIcon({ name: 'jupyter-dist:icon', svgstr: ICON_SVG });

export const CELL_TEMPLATE = `%%distrun --type pytorch --nodes 2 --procs-per-node 2
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # "nccl" on GPUs
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum of ranks = {total.item()}")
dist.barrier()
dist.destroy_process_group()`;

const LOAD_EXT = '%load_ext jupyter_dist';

namespace CommandIDs {
  export const openJobs = 'jupyter-dist:open-jobs';
  export const insertCell = 'jupyter-dist:insert-cell';
  export const openForm = 'jupyter-dist:open-form';
  export const openLogs = 'jupyter-dist:open-logs';
}

function hasLoadExt(panel: NotebookPanel): boolean {
  const cells = panel.content.model?.sharedModel.cells ?? [];
  return cells.some(cell => cell.getSource().includes(LOAD_EXT));
}

/** Insert cells below the active one; the last inserted becomes active. */
function insertCells(panel: NotebookPanel, sources: string[]): void {
  for (const source of sources) {
    NotebookActions.insertBelow(panel.content);
    panel.content.activeCell?.model.sharedModel.setSource(source);
  }
}

class DistrunToolbarButton implements DocumentRegistry.IWidgetExtension<NotebookPanel, INotebookModel> {
  constructor(private readonly app: JupyterFrontEnd) {}

  createNew(panel: NotebookPanel): IDisposable {
    const button = new ToolbarButton({
      className: 'jp-distrun-toolbar-button',
      icon: distrunIcon,
      label: '%%distrun',
      tooltip: 'Insert a %%distrun cell (distributed job)',
      onClick: () => void this.app.commands.execute(CommandIDs.insertCell)
    });
    panel.toolbar.insertItem(10, 'distrun', button);
    return new DisposableDelegate(() => button.dispose());
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-dist:plugin',
  description: 'Distributed jobs from notebook cells: nodes, jobs, logs, cancel',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    palette: ICommandPalette | null
  ) => {
    const api = new DistrunApi(serverRequester());
    const viewers = new Map<string, MainAreaWidget<JobLogViewer>>();

    const sidebar = new DistrunSidebar({
      api,
      openLogs: jobId => void app.commands.execute(CommandIDs.openLogs, { jobId })
    });
    sidebar.title.icon = distrunIcon;
    sidebar.title.caption = 'Distributed jobs (jupyter-dist)';
    app.shell.add(sidebar, 'left', { rank: 900 });

    app.commands.addCommand(CommandIDs.openJobs, {
      label: 'Distributed: Open Jobs Panel',
      icon: distrunIcon,
      execute: () => app.shell.activateById(sidebar.id)
    });

    app.commands.addCommand(CommandIDs.openLogs, {
      label: args => (args.jobId ? `Logs of ${args.jobId}` : 'Distributed: Open Job Logs'),
      execute: args => {
        const jobId = String(args.jobId ?? '');
        if (!jobId) {
          return;
        }
        const open = viewers.get(jobId);
        if (open && !open.isDisposed) {
          app.shell.activateById(open.id);
          return;
        }
        const widget = new MainAreaWidget({ content: new JobLogViewer(api, jobId) });
        widget.id = `jupyter-dist-logs-panel-${jobId}`;
        widget.title.label = `Logs ${jobId}`;
        widget.title.icon = distrunIcon;
        widget.title.closable = true;
        viewers.set(jobId, widget);
        app.shell.add(widget, 'main');
        app.shell.activateById(widget.id);
      }
    });

    // The live view in a cell asks for a job's full log with a DOM event (it cannot reach
    // the app's commands); the mark on the page tells it that someone listens.
    document.body.dataset.jupyterDistLogs = '1';
    document.addEventListener('jupyter-dist:open-logs', event => {
      const jobId = (event as CustomEvent<{ jobId?: string }>).detail?.jobId;
      if (jobId) {
        void app.commands.execute(CommandIDs.openLogs, { jobId });
      }
    });

    const notebookOpen = () => tracker.currentWidget !== null;

    app.commands.addCommand(CommandIDs.insertCell, {
      label: 'Distributed: Insert %%distrun Cell',
      caption: 'Insert a cell that runs its code on every rank of a distributed job',
      icon: distrunIcon,
      isEnabled: notebookOpen,
      execute: () => {
        const panel = tracker.currentWidget;
        if (panel) {
          insertCells(panel, hasLoadExt(panel) ? [CELL_TEMPLATE] : [LOAD_EXT, CELL_TEMPLATE]);
        }
      }
    });

    app.commands.addCommand(CommandIDs.openForm, {
      label: 'Distributed: Open Submission Form',
      caption: 'Insert and run a cell showing the job submission form',
      icon: distrunIcon,
      isEnabled: notebookOpen,
      execute: async () => {
        const panel = tracker.currentWidget;
        if (panel) {
          // As the template does: %load_ext only where the notebook lacks it (again, it
          // would print "already loaded" above the form).
          const form = '%distrun form';
          insertCells(panel, [hasLoadExt(panel) ? form : `${LOAD_EXT}\n${form}`]);
          await NotebookActions.run(panel.content, panel.sessionContext);
        }
      }
    });

    for (const command of [CommandIDs.insertCell, CommandIDs.openForm, CommandIDs.openJobs]) {
      palette?.addItem({ command, category: 'Distributed' });
    }
    app.docRegistry.addWidgetExtension('Notebook', new DistrunToolbarButton(app));
  }
};

export default plugin;
