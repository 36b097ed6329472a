/**
 * A job's logs in the main area: a tab per rank (or process), following new lines while the
 * job runs, holding at most `maxLines` lines per tab (the full log stays in the store).
 */

import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { DistrunApi, FINAL_STATES, IJobDetail, ILogLine } from './api';
import { h } from './dom';
import { keyLabel, LogModel, sortKeys } from './logmodel';

const FIRST_LINES = 2000; // a tab opens on the newest lines of its log
const PAGE_LINES = 5000; // lines asked for per request after that

export class JobLogViewer extends Widget {
  readonly model: LogModel;
  private readonly header = h('div', { class: 'jp-distrun-log-header' });
  private readonly tabs = h('div', { class: 'jp-distrun-log-tabs', role: 'tablist' });
  private readonly dropped = h('div', { class: 'jp-distrun-muted jp-distrun-log-dropped' });
  private readonly output = h('pre', { class: 'jp-distrun-log-output' });
  private readonly poll: Poll;
  private selected: string | null = null;
  private ended = false;
  private readonly complete = new Set<string>(); // tabs read to the end of an ended job
  private reading = false;

  constructor(
    private readonly api: DistrunApi,
    readonly jobId: string,
    maxLines = 10000
  ) {
    super();
    this.model = new LogModel(maxLines);
    this.id = `jupyter-dist-logs-${jobId}`;
    this.addClass('jp-distrun-logviewer');
    this.node.append(this.header, this.tabs, this.dropped, this.output);
    this.poll = new Poll({
      factory: () => this.tick(),
      frequency: { interval: 1000, backoff: true, max: 30000 },
      standby: () => !this.isVisible || document.hidden,
      name: `jupyter-dist:logs:${jobId}`
    });
  }

  dispose(): void {
    this.poll.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this.poll.refresh();
  }

  /** Show a tab (a click on it), and read what is new in its log now. */
  select(key: string): void {
    this.markSelected(key);
    void this.poll.refresh();
  }

  private markSelected(key: string): void {
    this.selected = key;
    for (const tab of Array.from(this.tabs.children)) {
      tab.classList.toggle('jp-mod-selected', (tab as HTMLElement).dataset.key === key);
      tab.setAttribute('aria-selected', String((tab as HTMLElement).dataset.key === key));
    }
    this.output.replaceChildren();
    this.render(this.model.buffer(key).lines);
  }

  private async tick(): Promise<void> {
    if (!this.ended) {
      const detail = await this.api.job(this.jobId);
      this.renderHeader(detail);
      this.renderTabs(sortKeys(detail.log_keys));
      // Known before the reads below: a read that starts after the end gets every line.
      this.ended = FINAL_STATES.includes(detail.state);
    }
    const key = this.selected;
    if (key && !this.complete.has(key) && (await this.follow(key)) && this.ended) {
      this.complete.add(key); // nothing more will come for this tab
    }
  }

  /** Read what is new in one log; true once caught up with it. */
  private async follow(key: string): Promise<boolean> {
    if (this.reading) {
      return false; // one reader at a time: two would append the same range twice
    }
    this.reading = true;
    try {
      return await this.readNew(key);
    } finally {
      this.reading = false;
    }
  }

  private async readNew(key: string): Promise<boolean> {
    const buffer = this.model.buffer(key);
    for (let round = 0; round < 5; round++) {
      const range =
        buffer.cursor === undefined
          ? await this.api.logs(this.jobId, key, { tail: FIRST_LINES })
          : await this.api.logs(this.jobId, key, { offset: buffer.cursor, limit: PAGE_LINES });
      const added = buffer.append(range);
      if (key === this.selected) {
        this.render(added);
      }
      if (buffer.cursor !== undefined && range.lines.length < PAGE_LINES) {
        return true;
      }
    }
    return false; // more to read: the next tick goes on
  }

  private render(lines: ILogLine[]): void {
    if (lines.length === 0) {
      return;
    }
    const atBottom =
      this.output.scrollTop + this.output.clientHeight >= this.output.scrollHeight - 4;
    const fragment = document.createDocumentFragment();
    for (const line of lines) {
      fragment.append(h('div', { class: `jp-distrun-line jp-distrun-${line.stream}` }, line.text));
    }
    this.output.append(fragment);
    const buffer = this.selected ? this.model.buffer(this.selected) : null;
    if (buffer) {
      const excess = this.output.childElementCount - buffer.maxLines;
      for (let i = 0; i < excess; i++) {
        this.output.firstElementChild?.remove();
      }
      this.dropped.textContent = buffer.dropped
        ? `Showing the last ${buffer.lines.length} lines; the full log is in the job store.`
        : '';
    }
    if (atBottom) {
      this.output.scrollTop = this.output.scrollHeight; // follow
    }
  }

  private renderHeader(detail: IJobDetail): void {
    this.title.label = `${detail.name || detail.type} logs`;
    this.header.replaceChildren(
      h('span', { class: `jp-distrun-state jp-distrun-state-${detail.state}` }, detail.state),
      h('span', { class: 'jp-distrun-job-name' }, ` ${detail.job_id}`),
      h('div', { class: 'jp-distrun-root-cause' }, detail.root_cause ?? ''),
      h('div', { class: 'jp-distrun-muted' }, detail.store_path)
    );
  }

  private renderTabs(keys: string[]): void {
    const shown = Array.from(this.tabs.children).map(t => (t as HTMLElement).dataset.key);
    for (const key of keys) {
      if (!shown.includes(key)) {
        const tab = h('button', {
          class: 'jp-Button jp-mod-styled jp-mod-minimal jp-distrun-log-tab',
          role: 'tab',
          'data-key': key
        });
        tab.textContent = keyLabel(key);
        tab.addEventListener('click', () => this.select(key));
        this.tabs.append(tab);
      }
    }
    if (this.selected === null && keys.length > 0) {
      this.markSelected(keys[0]);
    }
  }
}
