/**
 * The left-sidebar panel: the attached nodes with their health, and the jobs of every
 * notebook and the CLI with live status, Cancel and Stacks buttons (every rank's Python
 * stack, grouped: which rank is stuck, and where) and a way to their logs. It polls
 * politely: backs off on errors, and stands by while hidden.
 */

import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import {
  DistrunApi,
  FINAL_STATES,
  IJobSummary,
  INodePools,
  INodeUsage,
  INodes,
  IStacks
} from './api';
import { duration, h, memory, pausedText, plural, sparkline } from './dom';

/** JupyterLab's own button look (made compact by style/index.css). */
const BUTTON = 'jp-Button jp-mod-styled';

export interface ISidebarOptions {
  api: DistrunApi;
  openLogs: (jobId: string) => void;
  jobsInterval?: number; // ms
  nodesInterval?: number; // ms
  usageInterval?: number; // ms: the nodes' CPU and memory while jobs run
  poolsInterval?: number; // ms: the nodes' pools (--preload)
  jobsShown?: number; // the newest jobs listed; older ones are left to the CLI
}

export class DistrunSidebar extends Widget {
  private readonly api: DistrunApi;
  private readonly openLogs: (jobId: string) => void;
  private readonly nodesBox = h('div', { class: 'jp-distrun-nodes' }, 'Checking nodes…');
  private readonly poolsBox = h('div', { class: 'jp-distrun-pools' });
  private readonly jobsBox = h('div', { class: 'jp-distrun-jobs' }, 'Loading jobs…');
  private readonly errorBox = h('div', { class: 'jp-distrun-error' });
  private readonly jobsPoll: Poll;
  private readonly nodesPoll: Poll;
  private readonly usagePoll: Poll;
  private readonly poolsPoll: Poll;
  private nodes: INodes | null = null;
  private usage: INodeUsage = { bucket: 5, nodes: {} };
  private readonly jobsShown: number;
  private cancelling = new Set<string>();
  // The stacks shown under a job (kept across polls, which redraw the list), or why not.
  private stacks = new Map<string, IStacks | { error: string } | 'reading'>();

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
      this.poolsBox,
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
    this.usagePoll = new Poll({
      factory: () => this.refreshUsage(),
      frequency: { interval: options.usageInterval ?? 5000, backoff: true, max: 60000 },
      standby,
      name: 'jupyter-dist:node-usage'
    });
    this.poolsPoll = new Poll({
      factory: () => this.refreshPools(),
      frequency: { interval: options.poolsInterval ?? 10000, backoff: true, max: 300000 },
      standby,
      name: 'jupyter-dist:pools'
    });
  }

  /** Poll now (e.g. when the panel is shown, or after a cancel). */
  refresh(): void {
    void this.jobsPoll.refresh();
  }

  dispose(): void {
    this.jobsPoll.dispose();
    this.nodesPoll.dispose();
    this.usagePoll.dispose();
    this.poolsPoll.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this.jobsPoll.refresh();
    void this.nodesPoll.refresh();
    void this.usagePoll.refresh();
    void this.poolsPoll.refresh();
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
    this.nodes = await this.api.nodes();
    this.renderNodes();
  }

  private async refreshUsage(): Promise<void> {
    this.usage = await this.api.nodeUsage();
    this.renderNodes();
  }

  private async refreshPools(): Promise<void> {
    this.renderPools(await this.api.pools());
  }

  /** Each node's pools (--preload): modules, memory, ranks, how long idle; nothing while
   * there are none. */
  private renderPools(pools: INodePools): void {
    const rows = pools.nodes.flatMap(node =>
      node.pools.map(pool =>
        h(
          'tr',
          {
            'data-node': node.node,
            title: `pid ${pool.pid}, started ${Math.round(pool.age)} s ago; jupyter distrun pool stop ends it`
          },
          h('td', {}, node.node),
          h('td', {}, pool.modules.join(', ')),
          h('td', {}, pool.rss === null ? '' : memory(pool.rss)),
          h(
            'td',
            {},
            pool.ranks
              ? plural(pool.ranks, 'rank')
              : `idle ${Math.round(pool.idle)} s` +
                  (pool.idle_limit ? ` of ${Math.round(pool.idle_limit)}` : '')
          )
        )
      )
    );
    const problems = pools.nodes.filter(node => node.problem);
    this.poolsBox.replaceChildren(
      ...(rows.length
        ? [
            h('div', { class: 'jp-distrun-muted' }, 'Pools of pre-imported Python (--preload)'),
            h('table', { class: 'jp-distrun-table' }, ...rows)
          ]
        : []),
      ...problems.map(node =>
        h('div', { class: 'jp-distrun-muted' }, `${node.node}: pools not read (${node.problem})`)
      )
    );
  }

  private renderNodes(): void {
    const nodes = this.nodes;
    if (nodes === null) {
      return;
    }
    const rows = nodes.nodes.map(node =>
      h(
        'tr',
        { 'data-node': node.name, title: node.problem ?? '' },
        h('td', {}, h('span', { class: `jp-distrun-dot jp-distrun-${node.status}` }), node.name),
        h('td', {}, `${node.host}:${node.port}`),
        h('td', {}, node.latency_ms === null ? node.status : `${Math.round(node.latency_ms)} ms`),
        h('td', {}, node.gpus === null ? '' : `${node.gpus} GPU`),
        this.meter(node.name)
      )
    );
    // Local nodes (no inventory) have rows only while a job runs on them.
    const listed = new Set(nodes.nodes.map(node => node.name));
    for (const name of Object.keys(this.usage.nodes).sort()) {
      if (!listed.has(name)) {
        rows.push(h('tr', { 'data-node': name }, h('td', {}, name), this.meter(name)));
      }
    }
    const note = nodes.local ? 'No node inventory: jobs run on this machine.' : nodes.source;
    this.nodesBox.replaceChildren(
      ...(rows.length ? [h('table', { class: 'jp-distrun-table' }, ...rows)] : []),
      h('div', { class: 'jp-distrun-muted' }, note ?? '')
    );
  }

  /** A node's CPU over the last minutes as a sparkline, with its latest CPU and memory:
   * an idle node beside busy ones shows at a glance. Empty where no job runs on it. */
  private meter(name: string): HTMLTableCellElement {
    const series = this.usage.nodes[name];
    const cpu = series?.cpu.filter((v): v is number => v !== null) ?? [];
    if (!series || cpu.length === 0) {
      return h('td', { class: 'jp-distrun-meter' });
    }
    const rss = series.rss.filter((v): v is number => v !== null);
    const gpu = series.gpu?.filter((v): v is number => v !== null) ?? [];
    const now = `${Math.round(cpu[cpu.length - 1])}%`;
    const minutes = Math.round((series.cpu.length * this.usage.bucket) / 60);
    const onGpus = gpu.length ? `, GPU memory ${memory(gpu[gpu.length - 1])}` : '';
    return h(
      'td',
      {
        class: 'jp-distrun-meter',
        title:
          `CPU ${now} of one core, memory ${memory(rss[rss.length - 1] ?? 0)}${onGpus}, ` +
          `summed over the running jobs' processes on ${name} (the line: the last ` +
          `${minutes} minutes)`
      },
      sparkline(series.cpu, 100),
      h('span', {}, now)
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
      const reading = this.stacks.get(job.job_id) === 'reading';
      const stacks = h(
        'button',
        {
          class: `${BUTTON} jp-mod-reject jp-distrun-button jp-distrun-stacks-button`,
          title: "Every rank's Python stack now, grouped: which rank is stuck, and where"
        },
        reading ? 'Reading…' : 'Stacks'
      );
      stacks.disabled = reading;
      stacks.addEventListener('click', () => void this.readStacks(job.job_id));
      buttons.push(stacks, cancel);
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
        job.attempt ? h('span', { class: 'jp-distrun-muted jp-distrun-attempt' }, job.attempt) : null,
        h('span', { class: 'jp-distrun-muted' }, duration(job.started, job.ended))
      ),
      h('div', { class: 'jp-distrun-muted jp-distrun-job-id' }, `${job.job_id} · ${what}`),
      job.stalled
        ? h('div', { class: 'jp-distrun-stalled' }, `Looks stuck: ${job.stalled.replace(/^looks stuck: /, '')}`)
        : null,
      job.paused?.length
        ? h(
            'div',
            {
              class: 'jp-distrun-paused',
              title: `to step them: jupyter distrun debug ${job.job_id}, or the cell's live view`
            },
            `Paused in the debugger: ${pausedText(job.paused)}`
          )
        : null,
      job.root_cause ? h('div', { class: 'jp-distrun-root-cause' }, job.root_cause) : null,
      !job.root_cause && job.message && (!running || job.state === 'restarting')
        ? h('div', { class: 'jp-distrun-muted' }, job.message)
        : null,
      ...(job.attempts ?? []).map(line =>
        h('div', { class: 'jp-distrun-muted jp-distrun-earlier-attempt' }, line)
      ),
      running && (job.progress || job.metrics) ? this.metricsLine(job) : null,
      h('div', { class: 'jp-distrun-job-buttons' }, ...buttons),
      this.stacksBox(job.job_id)
    );
  }

  /** A running job's progress and each metric's latest value (the mean over its ranks). */
  private metricsLine(job: IJobSummary): HTMLElement {
    const parts = [
      ...(job.progress ? [job.progress] : []),
      ...Object.entries(job.metrics ?? {}).map(([name, value]) => `${name} ${compact(value)}`)
    ];
    return h(
      'div',
      { class: 'jp-distrun-muted jp-distrun-metrics', title: 'latest, averaged over the ranks' },
      parts.join(' · ')
    );
  }

  private stacksBox(jobId: string): HTMLElement | null {
    const shown = this.stacks.get(jobId);
    if (shown === undefined || shown === 'reading') {
      return null;
    }
    const close = h('button', { class: 'jp-Button jp-mod-minimal', title: 'close' }, '×');
    close.addEventListener('click', () => {
      this.stacks.delete(jobId);
      this.refresh();
    });
    if ('error' in shown) {
      return h(
        'div',
        { class: 'jp-distrun-stacks' },
        h('div', { class: 'jp-distrun-stacks-head' }, 'Stacks could not be read', close),
        h('div', { class: 'jp-distrun-error' }, shown.error)
      );
    }
    const odd = shown.summary.length > 1;
    return h(
      'div',
      { class: 'jp-distrun-stacks' },
      h('div', { class: 'jp-distrun-stacks-head' }, shown.heading, close),
      h(
        'ul',
        { class: 'jp-distrun-stacks-groups' },
        ...shown.summary.map((line, i) =>
          h('li', { class: i === 0 && odd ? 'jp-distrun-stacks-odd' : '' }, line)
        )
      ),
      h(
        'details',
        {},
        h('summary', {}, 'Every frame'),
        h('pre', { class: 'jp-distrun-stacks-text' }, shown.text)
      )
    );
  }

  private async readStacks(jobId: string): Promise<void> {
    this.stacks.set(jobId, 'reading');
    this.refresh();
    try {
      this.stacks.set(jobId, await this.api.stacks(jobId));
    } catch (error) {
      this.stacks.set(jobId, { error: error instanceof Error ? error.message : String(error) });
    }
    this.refresh();
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

/** A metric's value in few characters: 0.0123, 4.1e-05, 1.2e+06; NaN and the infinities
 * as the server names them ("NaN", "Infinity"). */
export function compact(value: number | string): string {
  if (typeof value !== 'number') {
    return String(value);
  }
  const size = Math.abs(value);
  if (size !== 0 && (size < 1e-3 || size >= 1e5)) {
    return value.toExponential(1);
  }
  return String(Number(value.toPrecision(3)));
}
