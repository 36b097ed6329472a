/**
 * The left-sidebar panel: the attached nodes with their health, and the jobs of every
 * notebook and the CLI with live status, a Cancel button and a way to their logs. It polls
 * politely: backs off on errors, and stands by while hidden.
 */

import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { DistrunApi, FINAL_STATES, IJobSummary, INodes } from './api';
import { duration, h, plural } from './dom';

/** JupyterLab's own button look (made compact by style/index.css). */
const BUTTON = 'jp-Button jp-mod-styled';

export interface ISidebarOptions {
  api: DistrunApi;
  openLogs: (jobId: string) => void;
  jobsInterval?: number; // ms
  nodesInterval?: number; // ms
  jobsShown?: number; // the newest jobs listed; older ones are left to the CLI
}

export class DistrunSidebar extends Widget {
  private readonly api: DistrunApi;
  private readonly openLogs: (jobId: string) => void;
  private readonly nodesBox = h('div', { class: 'jp-distrun-nodes' }, 'Checking nodes…');
  private readonly jobsBox = h('div', { class: 'jp-distrun-jobs' }, 'Loading jobs…');
  private readonly errorBox = h('div', { class: 'jp-distrun-error' });
  private readonly jobsPoll: Poll;
  private readonly nodesPoll: Poll;
  private readonly jobsShown: number;
  private cancelling = new Set<string>();

  constructor(options: ISidebarOptions) {
    super();
    this.api = options.api;
    this.openLogs = options.openLogs;
    this.jobsShown = options.jobsShown ?? 100;
    this.id = 'jupyter-dist-sidebar';
    this.addClass('jp-distrun-sidebar');
    this.node.append(
      h('h2', {}, 'Distributed jobs'),
      this.errorBox,
      h('h3', {}, 'Nodes'),
      this.nodesBox,
      h('h3', {}, 'Jobs'),
      this.jobsBox
    );
    const standby = () => !this.isVisible || document.hidden;
    this.jobsPoll = new Poll({
      factory: () => this.refreshJobs(),
      frequency: { interval: options.jobsInterval ?? 2000, backoff: true, max: 60000 },
      standby,
      name: 'jupyter-dist:jobs'
    });
    this.nodesPoll = new Poll({
      factory: () => this.refreshNodes(),
      frequency: { interval: options.nodesInterval ?? 30000, backoff: true, max: 300000 },
      standby,
      name: 'jupyter-dist:nodes'
    });
  }

  /** Poll now (e.g. when the panel is shown, or after a cancel). */
  refresh(): void {
    void this.jobsPoll.refresh();
  }

  dispose(): void {
    this.jobsPoll.dispose();
    this.nodesPoll.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this.jobsPoll.refresh();
    void this.nodesPoll.refresh();
  }

  private async refreshJobs(): Promise<void> {
    try {
      const jobs = await this.api.jobs(this.jobsShown + 1); // one more: are there older ones?
      this.errorBox.textContent = '';
      this.renderJobs(jobs);
    } catch (error) {
      this.errorBox.textContent = `Cannot reach the jupyter-dist server extension: ${error}`;
      throw error; // the poll backs off
    }
  }

  private async refreshNodes(): Promise<void> {
    this.renderNodes(await this.api.nodes());
  }

  private renderNodes(nodes: INodes): void {
    if (nodes.local) {
      this.nodesBox.replaceChildren(
        h('div', { class: 'jp-distrun-muted' }, 'No node inventory: jobs run on this machine.')
      );
      return;
    }
    const rows = nodes.nodes.map(node =>
      h(
        'tr',
        { 'data-node': node.name, title: node.problem ?? '' },
        h('td', {}, h('span', { class: `jp-distrun-dot jp-distrun-${node.status}` }), node.name),
        h('td', {}, `${node.host}:${node.port}`),
        h('td', {}, node.latency_ms === null ? node.status : `${Math.round(node.latency_ms)} ms`),
        h('td', {}, node.gpus === null ? '' : `${node.gpus} GPU`)
      )
    );
    this.nodesBox.replaceChildren(
      h('table', { class: 'jp-distrun-table' }, ...rows),
      h('div', { class: 'jp-distrun-muted' }, nodes.source ?? '')
    );
  }

  private renderJobs(jobs: IJobSummary[]): void {
    if (jobs.length === 0) {
      this.jobsBox.replaceChildren(
        h('div', { class: 'jp-distrun-muted' }, 'No jobs yet. Run a %%distrun cell to start one.')
      );
      return;
    }
    const rows = jobs.slice(0, this.jobsShown).map(job => this.jobRow(job));
    if (jobs.length > this.jobsShown) {
      rows.push(
        h(
          'div',
          { class: 'jp-distrun-muted jp-distrun-older' },
          `Only the newest ${this.jobsShown} jobs are shown; \`jupyter distrun jobs\` lists them all.`
        )
      );
    }
    this.jobsBox.replaceChildren(...rows);
  }

  private jobRow(job: IJobSummary): HTMLElement {
    const running = !FINAL_STATES.includes(job.state);
    if (!running) {
      this.cancelling.delete(job.job_id); // asked, and now it has stopped
    }
    const logs = h(
      'button',
      { class: `${BUTTON} jp-mod-reject jp-distrun-button`, title: 'Open per-rank logs' },
      'Logs'
    );
    logs.addEventListener('click', () => this.openLogs(job.job_id));
    const buttons = [logs];
    if (running) {
      const pending = this.cancelling.has(job.job_id);
      const cancel = h(
        'button',
        {
          class: `${BUTTON} jp-mod-warn jp-distrun-button jp-distrun-cancel`,
          title: 'Stop every rank of this job'
        },
        pending ? 'Cancelling…' : 'Cancel'
      );
      cancel.disabled = pending;
      cancel.addEventListener('click', () => void this.cancel(job.job_id));
      buttons.push(cancel);
    }
    const ranked = ['pytorch', 'mpi'].includes(job.type) && job.world_size;
    const size = ranked ? plural(job.world_size!, 'rank') : plural(job.processes, 'process');
    const what = `${job.type} · ${size} · ${job.nodes.join(', ')}`;
    return h(
      'div',
      { class: 'jp-distrun-job', 'data-job-id': job.job_id, 'data-state': job.state },
      h(
        'div',
        { class: 'jp-distrun-job-head' },
        h('span', { class: `jp-distrun-state jp-distrun-state-${job.state}` }, job.state),
        h('span', { class: 'jp-distrun-job-name' }, job.name || job.type),
        h('span', { class: 'jp-distrun-muted' }, duration(job.started, job.ended))
      ),
      h('div', { class: 'jp-distrun-muted jp-distrun-job-id' }, `${job.job_id} · ${what}`),
      job.root_cause ? h('div', { class: 'jp-distrun-root-cause' }, job.root_cause) : null,
      !job.root_cause && job.message && !running
        ? h('div', { class: 'jp-distrun-muted' }, job.message)
        : null,
      h('div', { class: 'jp-distrun-job-buttons' }, ...buttons)
    );
  }

  private async cancel(jobId: string): Promise<void> {
    this.cancelling.add(jobId);
    this.refresh();
    try {
      const reply = await this.api.cancel(jobId);
      if (reply.state === 'lost') {
        this.errorBox.textContent = reply.message;
        this.cancelling.delete(jobId);
      }
    } catch (error) {
      this.errorBox.textContent = `Could not cancel ${jobId}: ${error}`;
      this.cancelling.delete(jobId);
    }
    this.refresh(); // the button says "Cancelling…" until the job has stopped
  }
}
