/**
 * The cell's live view (jupyter_dist/widgets/live.js, plain ESM loaded by anywidget):
 * ANSI colours to DOM, and the bounded, model-held line buffers.
 */
// eslint-disable-next-line @typescript-eslint/ban-ts-comment
// @ts-ignore: a plain JavaScript module without types
import live, {
  CHART_POINTS,
  MOST_CHARTS,
  SLOW_FOR_S,
  slowRanks,
  stepRates,
  rankProgress,
  chartOf,
  ticksOf,
  yAxisOf,
  defaultScale,
  keepMetrics,
  progressOf,
  short,
  ansiToNodes,
  lastState,
  clock,
  fetchStacks,
  sendDebug,
  debugLines,
  rankOfKey,
  jupyterServer,
  stateCounts
} from '../../../jupyter_dist/widgets/live.js';

type Handler = (...args: any[]) => void;

/** The part of an anywidget model the view uses: traits, events, custom messages. */
class FakeModel {
  private handlers: { [event: string]: Handler[] } = {};
  sent: any[] = [];
  constructor(private traits: { [name: string]: any }) {}
  send(content: any): void {
    this.sent.push(content);
  }
  get(name: string): any {
    return this.traits[name];
  }
  set(name: string, value: any): void {
    this.traits[name] = value;
  }
  on(event: string, handler: Handler): void {
    (this.handlers[event] ??= []).push(handler);
  }
  emit(event: string, ...args: any[]): void {
    for (const handler of this.handlers[event] ?? []) {
      handler(...args);
    }
  }
}

function model(jobId: string, maxLines = 5, linesTotal = 0, processes: any[] = []): FakeModel {
  return new FakeModel({
    job_id: jobId,
    name: '',
    summary: '',
    elapsed: 0,
    state: 'running',
    processes,
    root_cause: '',
    log_dir: '/tmp/logs',
    max_lines: maxLines,
    lines_total: linesTotal
  });
}

function lines(from: number, count: number, key = 'rank-0', type = 'lines'): any {
  const out = [];
  for (let i = from; i < from + count; i++) {
    out.push([key, key.replace('-', ' '), 'stdout', `line ${i}`]);
  }
  return { type, lines: out, total: from + count };
}

function shown(el: HTMLElement): (string | null)[] {
  return Array.from(el.querySelectorAll('pre.distrun-lines > div')).map(d => d.textContent);
}

describe('lastState', () => {
  it('shows a progress bar as a terminal would: after its last carriage return', () => {
    expect(lastState('10%\r50%\r100%')).toBe('100%');
    expect(lastState('done 100%\r')).toBe('done 100%');
    expect(lastState('no bar here')).toBe('no bar here');
  });
});

describe('ansiToNodes', () => {
  it('turns SGR colours and bold into styled spans, dropping other codes and resetting', () => {
    const nodes = ansiToNodes('plain \x1b[1;31mred bold\x1b[0m back\x1b[2K');
    const holder = document.createElement('div');
    holder.append(...nodes);
    expect(holder.textContent).toBe('plain red bold back');
    const spans = Array.from(holder.querySelectorAll('span'));
    expect(spans.map(s => s.textContent)).toEqual(['plain ', 'red bold', ' back']);
    expect(spans.map(s => s.style.color)).toEqual(['', 'rgb(204, 51, 51)', '']);
    expect(spans.map(s => s.style.fontWeight)).toEqual(['', 'bold', '']);
  });

  it('keeps text without codes as one node, as text', () => {
    const nodes = ansiToNodes('no colours <b>here</b>');
    expect(nodes).toHaveLength(1);
    expect(nodes[0].textContent).toBe('no colours <b>here</b>'); // text, never HTML
  });
});

describe('live view buffers', () => {
  it('keeps lines that came before the view rendered, within max_lines', () => {
    const m = model('job-early');
    live.initialize({ model: m });
    m.emit('msg:custom', lines(0, 8));
    const el = document.createElement('div');
    live.render({ model: m, el });
    const shown = Array.from(el.querySelectorAll('pre.distrun-lines > div')).map(
      d => d.textContent
    );
    expect(shown).toEqual(['[rank 0] line 3', '[rank 0] line 4', '[rank 0] line 5',
      '[rank 0] line 6', '[rank 0] line 7']); // prettier-ignore
  });

  it('draws new lines in every view and bounds each pane', () => {
    const m = model('job-two-views', 3);
    live.initialize({ model: m });
    const first = document.createElement('div');
    const second = document.createElement('div');
    live.render({ model: m, el: first });
    const cleanup = live.render({ model: m, el: second });
    m.emit('msg:custom', lines(0, 2, 'rank-1'));
    m.emit('msg:custom', lines(2, 2, 'rank-0'));
    for (const el of [first, second]) {
      expect(el.querySelectorAll('pre.distrun-lines > div')).toHaveLength(3);
      const tabs = Array.from(el.querySelectorAll('.distrun-rankbar button')).map(
        b => b.textContent
      );
      expect(tabs).toEqual(['All ranks', 'rank 0', 'rank 1']);
    }
    cleanup(); // a removed view is no longer drawn into
    m.emit('msg:custom', lines(4, 1, 'rank-0'));
    expect(second.querySelector('pre.distrun-lines')?.lastElementChild?.textContent).toBe(
      '[rank 0] line 3'
    );
    expect(first.querySelector('pre.distrun-lines')?.lastElementChild?.textContent).toBe(
      '[rank 0] line 4'
    );
  });

  it('asks nothing of the kernel when it saw every line from the start', () => {
    const m = model('job-fresh');
    live.initialize({ model: m });
    m.emit('msg:custom', lines(0, 2));
    expect(m.sent).toEqual([]);
  });

  it('a page loaded again asks once for the lines it missed and draws them in every tab', () => {
    const m = model('job-reloaded', 3, 7);
    live.initialize({ model: m });
    expect(m.sent).toEqual([{ type: 'history' }]);
    const el = document.createElement('div');
    live.render({ model: m, el });
    expect(shown(el)).toEqual([]);
    const history = lines(3, 2, 'rank-1', 'history');
    history.lines.push(...lines(5, 2, 'rank-0').lines);
    history.total = 7;
    m.emit('msg:custom', history);
    expect(shown(el)).toEqual(['[rank 1] line 4', '[rank 0] line 5', '[rank 0] line 6']);
    const tabs = Array.from(el.querySelectorAll('.distrun-rankbar button'));
    expect(tabs.map(b => b.textContent)).toEqual(['All ranks', 'rank 0', 'rank 1']);
    (tabs[2] as HTMLButtonElement).click();
    expect(shown(el)).toEqual(['line 3', 'line 4']);
    m.emit('msg:custom', lines(7, 1, 'rank-1')); // and goes on with new lines
    expect(shown(el)).toEqual(['line 3', 'line 4', 'line 7']);
  });

  it('ignores history that is not newer than what it holds', () => {
    const m = model('job-up-to-date', 5, 0);
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    m.emit('msg:custom', lines(0, 3));
    m.emit('msg:custom', lines(0, 1, 'rank-0', 'history')); // total 1 < 3 held
    expect(shown(el)).toEqual(['[rank 0] line 0', '[rank 0] line 1', '[rank 0] line 2']);
  });
});

function ranks(count: number, failed: number[] = []): any[] {
  return Array.from({ length: count }, (_, r) => ({
    name: `rank-${r}`,
    label: `rank ${r}`,
    state: failed.includes(r) ? 'failed' : 'running',
    keys: [`rank-${r}`]
  }));
}

describe('live view at scale and state', () => {
  it('gives each rank a chip coloured by its state, with labels while there are few', () => {
    const m = model('job-few', 5, 0, ranks(4, [2]));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const chips = Array.from(el.querySelectorAll('.distrun-rankbar button.distrun-rank'));
    expect(chips.map(c => c.textContent)).toEqual(['rank 0', 'rank 1', 'rank 2', 'rank 3']);
    expect(chips[2].className).toContain('distrun-state-failed');
    expect(chips[0].className).toContain('distrun-state-running');
    expect(el.querySelector('.distrun-counts')?.textContent).toBe('1 failed · 3 running');
    expect(el.querySelector('.distrun-inspector')?.hasAttribute('open')).toBe(false);
  });

  it('keeps 64 ranks usable: a numbered grid, the failed ranks first by name', () => {
    const m = model('job-64', 5, 0, ranks(64, [41, 7]));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const bar = el.querySelector('.distrun-rankbar') as HTMLElement;
    expect(bar.classList.contains('distrun-compact')).toBe(true);
    const failed = Array.from(bar.querySelectorAll('.distrun-failed-group button'));
    expect(failed.map(b => b.textContent)).toEqual(['rank 7', 'rank 41']);
    const grid = Array.from(bar.querySelectorAll('.distrun-grid button'));
    expect(grid).toHaveLength(64);
    expect(grid.slice(0, 3).map(b => b.textContent)).toEqual(['0', '1', '2']);
    m.emit('msg:custom', lines(0, 2, 'rank-41'));
    m.emit('msg:custom', lines(2, 1, 'rank-3'));
    (failed[1] as HTMLButtonElement).click(); // rank 41, from the failed group
    expect(shown(el)).toEqual(['line 0', 'line 1']);
    expect(bar.querySelector('.distrun-showing')?.textContent).toBe('rank 41');
  });

  it('says how many processes are in which state, and all of them when they agree', () => {
    expect(stateCounts(ranks(3))).toBe('all running');
    expect(stateCounts([...ranks(2), { state: 'succeeded' }, { state: 'failed' }])).toBe(
      '1 failed · 2 running · 1 succeeded'
    );
  });

  it('marks a rank paused in its debugger on its chip, and counts the paused', () => {
    const processes = ranks(3);
    processes[1].paused = ['paused at bp.py:7 in <module> (breakpoint)'];
    expect(stateCounts(processes)).toBe('all running · 1 paused in the debugger');
    const m = model('job-paused', 5, 0, processes);
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const chip = (key: string) => el.querySelector(`.distrun-rank[data-key="${key}"]`) as HTMLElement;
    expect(chip('rank-1').classList.contains('distrun-paused')).toBe(true);
    expect(chip('rank-1').title).toContain(
      'rank 1: running (no output yet); paused at bp.py:7 in <module> (breakpoint)'
    );
    expect(chip('rank-0').classList.contains('distrun-paused')).toBe(false);
    (m as any).traits.processes = ranks(3); // it ran on
    m.emit('change:processes');
    expect(chip('rank-1').classList.contains('distrun-paused')).toBe(false);
  });

  it('counts the elapsed time on while the job runs, and stops when it ends', () => {
    jest.useFakeTimers();
    try {
      const m = model('job-clock', 5, 0, ranks(2));
      (m as any).traits.elapsed = 5;
      live.initialize({ model: m });
      const el = document.createElement('div');
      live.render({ model: m, el });
      const shownClock = () => el.querySelector('.distrun-elapsed')?.textContent;
      expect(shownClock()).toBe('0:05');
      jest.advanceTimersByTime(3000);
      expect(shownClock()).toBe('0:08');
      (m as any).traits.state = 'succeeded';
      (m as any).traits.elapsed = 9.2; // the kernel's final figure wins
      m.emit('change:elapsed');
      m.emit('change:state');
      expect(shownClock()).toBe('0:09');
      jest.advanceTimersByTime(5000);
      expect(shownClock()).toBe('0:09');
    } finally {
      jest.useRealTimers();
    }
  });

  it('shows elapsed time as a clock', () => {
    expect([clock(0), clock(7.9), clock(725), clock(3723)]).toEqual([
      '0:00',
      '0:07',
      '12:05',
      '1:02:03'
    ]);
  });
});

describe('session cells, settled views and plan checks', () => {
  it('keeps each session cell of one job apart', () => {
    const first = model('job-cells', 5, 0, ranks(2));
    first.set('cell', 1);
    const second = model('job-cells', 5, 0, ranks(2));
    second.set('cell', 2);
    const els = [first, second].map(m => {
      live.initialize({ model: m });
      const el = document.createElement('div');
      live.render({ model: m, el });
      return el;
    });
    first.emit('msg:custom', lines(0, 2));
    second.emit('msg:custom', lines(5, 1));
    expect(shown(els[0])).toEqual(['[rank 0] line 0', '[rank 0] line 1']);
    expect(shown(els[1])).toEqual(['[rank 0] line 5']);
  });

  it("draws a settled view (a new model of the job) from the live view's lines", () => {
    const liveModel = model('job-settled', 5, 0, ranks(1));
    live.initialize({ model: liveModel });
    liveModel.emit('msg:custom', lines(0, 3));
    const settled = model('job-settled', 5, 3, ranks(1));
    live.initialize({ model: settled });
    const el = document.createElement('div');
    live.render({ model: settled, el });
    expect(shown(el)).toEqual(['[rank 0] line 0', '[rank 0] line 1', '[rank 0] line 2']);
    expect(settled.sent).toEqual([]); // it holds every line: nothing to ask
    const lost = model('job-lost', 5, 3, ranks(1)); // a page that got none of them
    live.initialize({ model: lost });
    expect(lost.sent).toEqual([{ type: 'history' }]);
  });

  it('keeps the rank the user picked and an open inspector when the settled view comes', () => {
    const liveModel = model('job-settled-ui', 5, 0, ranks(2));
    live.initialize({ model: liveModel });
    const first = document.createElement('div');
    live.render({ model: liveModel, el: first });
    (first.querySelector('.distrun-rank[data-key="rank-1"]') as HTMLElement).click();
    const inspector = first.querySelector('.distrun-inspector') as HTMLDetailsElement;
    inspector.open = true;
    inspector.dispatchEvent(new Event('toggle'));
    const settled = model('job-settled-ui', 5, 0, ranks(2));
    live.initialize({ model: settled });
    const el = document.createElement('div');
    live.render({ model: settled, el });
    expect(el.querySelector('.distrun-active')?.textContent).toBe('rank 1');
    expect((el.querySelector('.distrun-inspector') as HTMLDetailsElement).open).toBe(true);
    const other = model('job-other', 5, 0, ranks(2)); // another job starts as usual
    live.initialize({ model: other });
    const fresh = document.createElement('div');
    live.render({ model: other, el: fresh });
    expect(fresh.querySelector('.distrun-active')?.textContent).toBe('All ranks');
    expect((fresh.querySelector('.distrun-inspector') as HTMLDetailsElement).open).toBe(false);
  });

  it("gives each rank the same colour in the settled view as in the live one", () => {
    const liveModel = model('job-settled-colours', 2, 0, ranks(2));
    live.initialize({ model: liveModel });
    live.render({ model: liveModel, el: document.createElement('div') });
    liveModel.emit('msg:custom', lines(0, 1, 'rank-1')); // rank 1 speaks first
    liveModel.emit('msg:custom', lines(1, 2, 'rank-0')); // and drops out of the last 2 lines
    // jsdom drops a colour written as var(...), so the page's per-job record is read.
    const held = (globalThis as any).__jupyterDistLines.get('job-settled-colours/0');
    const before = { ...held.colours };
    expect(Object.keys(before)).toEqual(['rank-1', 'rank-0']);
    const settled = model('job-settled-colours', 2, 3, ranks(2));
    live.initialize({ model: settled });
    const el = document.createElement('div');
    live.render({ model: settled, el });
    expect(shown(el)).toEqual(['[rank 0] line 1', '[rank 0] line 2']);
    expect(held.colours).toEqual(before);
  });

  it('shows what stands out in the plan, and nothing when all is well', () => {
    const m = model('job-checks', 5, 0, ranks(2));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const box = el.querySelector('.distrun-checks') as HTMLElement;
    expect(box.style.display).toBe('none');
    m.set('checks', ['OMP_NUM_THREADS is unset and local0 runs 2 ranks']);
    m.emit('change:checks');
    expect(box.style.display).toBe('');
    expect(Array.from(box.querySelectorAll('li')).map(li => li.textContent)).toEqual([
      'OMP_NUM_THREADS is unset and local0 runs 2 ranks'
    ]);
  });
});


describe('stacks', () => {
  const config = (data: any) => {
    document.getElementById('jupyter-config-data')?.remove();
    const script = document.createElement('script');
    script.id = 'jupyter-config-data';
    script.type = 'application/json';
    script.textContent = JSON.stringify(data);
    document.body.appendChild(script);
  };
  afterEach(() => document.getElementById('jupyter-config-data')?.remove());

  it("finds the page's Jupyter server, and none where there is no config", () => {
    expect(jupyterServer()).toBeNull();
    config({ baseUrl: '/user/a/', token: 'secret' });
    expect(jupyterServer()).toEqual({ baseUrl: '/user/a/', token: 'secret' });
  });

  it('asks the server with the XSRF cookie and the token, and turns failures into a line', async () => {
    document.cookie = '_xsrf=abc%7C1';
    const calls: any[] = [];
    const ok = async (url: string, init: any) => {
      calls.push([url, init]);
      return { ok: true, status: 200, json: async () => ({ heading: 'h', summary: ['s'] }) };
    };
    const server = { baseUrl: '/user/a', token: 't' };
    expect(await fetchStacks(server, 'job 1', ok as any)).toEqual({ heading: 'h', summary: ['s'] });
    expect(calls[0][0]).toBe('/user/a/distrun/jobs/job%201/stacks');
    expect(calls[0][1].method).toBe('POST');
    expect(calls[0][1].headers).toEqual({ 'X-XSRFToken': 'abc|1', Authorization: 'token t' });
    const refused = async () => ({
      ok: false,
      status: 400,
      json: async () => ({ message: 'job x is succeeded; stacks are read from a running job' })
    });
    expect(await fetchStacks(server, 'x', refused as any)).toEqual({
      error: 'job x is succeeded; stacks are read from a running job'
    });
    const down = async () => {
      throw new Error('connection refused');
    };
    expect((await fetchStacks(server, 'x', down as any)).error).toBe(
      'the server could not be reached (connection refused)'
    );
  });

  it('shows a Stacks button only with a server and while the job runs', () => {
    const without = model('job-no-server', 5, 0, ranks(2));
    live.initialize({ model: without });
    const plain = document.createElement('div');
    live.render({ model: without, el: plain });
    expect(plain.querySelector('.distrun-stacks-button')).toBeNull();

    config({ baseUrl: '/' });
    const m = model('job-stacks', 5, 0, ranks(2));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const button = el.querySelector('.distrun-stacks-button') as HTMLElement;
    expect(button.style.display).toBe('');
    m.set('state', 'failed');
    m.emit('change:state');
    expect(button.style.display).toBe('none');
  });

  it("writes a pdb command's answers into each rank's output, as pdb's console shows them", () => {
    expect(rankOfKey('rank-12')).toBe(12);
    expect(rankOfKey('launcher-node0')).toBeNull();
    const lines = debugLines('p x', [
      { rank: 1, answer: '41\n', paused: true },
      { rank: 3, answer: '', paused: false },
      { rank: 2, error: 'rank 2 of job j is not paused' },
      { rank: 4, answer: '', paused: false, state: 'busy' },
      { rank: 5, answer: '', paused: false, state: 'ended', exit: 'exited with code 3', job: 'failed' }
    ]);
    expect(lines.map((l: any) => [l.key, l.stream, l.text])).toEqual([
      ['rank-1', 'debug', '(Pdb) p x'],
      ['rank-1', 'debug', '41'],
      ['rank-3', 'debug', '(Pdb) p x'],
      ['rank-3', 'debug', '(runs on)'],
      ['rank-2', 'debug', '(Pdb) p x'],
      ['rank-2', 'stderr', 'error: rank 2 of job j is not paused'],
      ['rank-4', 'debug', '(Pdb) p x'],
      ['rank-4', 'debug', '(still runs the command; it pauses again once it ends)'],
      ['rank-5', 'debug', '(Pdb) p x'],
      ['rank-5', 'debug', '(exited with code 3 during the command; the job failed)']
    ]);
  });

  it("sends the console's command and ranks as JSON to the job's debug endpoint", async () => {
    const calls: any[] = [];
    const ok = async (url: string, init: any) => {
      calls.push([url, init]);
      return { ok: true, status: 200, json: async () => ({ answers: [] }) };
    };
    const server = { baseUrl: '/', token: '' };
    expect(await sendDebug(server, 'j', '0,2-3', 'p x', ok as any)).toEqual({ answers: [] });
    expect(calls[0][0]).toBe('/distrun/jobs/j/debug');
    expect(JSON.parse(calls[0][1].body)).toEqual({ ranks: '0,2-3', command: 'p x' });
    expect(calls[0][1].headers['Content-Type']).toBe('application/json');
  });

  it('shows the console while a rank is paused; a command answers in its tab', async () => {
    config({ baseUrl: '/' });
    const paused = ranks(2);
    paused[1] = { ...paused[1], rank: 1, node: 'local1',
      paused: ['paused at bp.py:6 in <module> (breakpoint)'], paused_ranks: [1] };
    const m = model('job-debug', 50, 0, ranks(2));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const box = el.querySelector('.distrun-debug') as HTMLElement;
    expect(box.style.display).toBe('none');
    m.set('processes', paused);
    m.emit('change:processes');
    expect(box.style.display).toBe('');
    expect(box.querySelector('.distrun-debug-head')?.textContent).toBe('Debugger: 1 rank paused');
    expect(box.querySelector('.distrun-debug-where li')?.textContent).toBe(
      'rank 1 (local1): paused at bp.py:6 in <module> (breakpoint)'
    );
    (el.querySelector('button.distrun-rank[data-key="rank-1"]') as HTMLElement).click();
    const ranksInput = box.querySelector('.distrun-debug-ranks') as HTMLInputElement;
    expect(ranksInput.value).toBe('1');
    const asked: any[] = [];
    const realFetch = globalThis.fetch;
    globalThis.fetch = (async (url: string, init: any) => {
      asked.push(JSON.parse(init.body));
      return { ok: true, status: 200,
        json: async () => ({ answers: [{ rank: 1, answer: '41\n', paused: true }] }) };
    }) as any;
    try {
      const command = box.querySelector('.distrun-debug-command') as HTMLInputElement;
      command.value = 'p x';
      (box.querySelector('form') as HTMLFormElement).dispatchEvent(
        new Event('submit', { cancelable: true }));
      await new Promise(resolve => setTimeout(resolve, 0));
    } finally {
      globalThis.fetch = realFetch;
    }
    expect(asked).toEqual([{ ranks: '1', command: 'p x' }]);
    const shown = Array.from(el.querySelectorAll('.distrun-lines .distrun-debug-line'));
    expect(shown.map(l => l.textContent)).toEqual(['(Pdb) p x', '41']);
    m.set('state', 'succeeded');
    m.emit('change:state');
    expect(box.style.display).toBe('none');
  });

  it('shows a stall notice with its stacks as a warning, and hides it once the job moves', () => {
    const m = model('job-stall', 5, 0, ranks(4));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const panel = el.querySelector('.distrun-stacks') as HTMLElement;
    expect(panel.style.display).toBe('none');
    m.set('stall', [
      'looks stuck: no rank printed or used CPU for 300 s',
      'rank 2 (node1): train.py:6 in load_batch',
      'ranks 0-1, 3 (node0, node1): all_reduce'
    ]);
    m.emit('change:stall');
    expect(panel.style.display).toBe('');
    expect(panel.classList.contains('distrun-stacks-stall')).toBe(true);
    expect(panel.querySelector('.distrun-stacks-head')?.textContent).toContain(
      'The job looks stuck: no rank printed or used CPU for 300 s'
    );
    expect(Array.from(panel.querySelectorAll('li')).map(li => li.className)).toEqual([
      'distrun-stacks-odd',
      ''
    ]);
    m.set('stall', []);
    m.emit('change:stall');
    expect(panel.style.display).toBe('none');
  });

  it('draws the groups, the odd one marked, and every frame folded', async () => {
    config({ baseUrl: '/' });
    const dump = {
      heading: 'Stacks of job j: 4 Python processes on 2 nodes',
      summary: ['rank 2 (node1): train.py:6 in load_batch', 'ranks 0-1, 3 (node0, node1): all_reduce'],
      text: 'every frame'
    };
    const original = globalThis.fetch;
    globalThis.fetch = (async () => ({ ok: true, status: 200, json: async () => dump })) as any;
    try {
      const m = model('job-stacks-drawn', 5, 0, ranks(4));
      live.initialize({ model: m });
      const el = document.createElement('div');
      live.render({ model: m, el });
      (el.querySelector('.distrun-stacks-button') as HTMLElement).click();
      await new Promise(resolve => setTimeout(resolve, 0));
      const panel = el.querySelector('.distrun-stacks') as HTMLElement;
      expect(panel.style.display).toBe('');
      expect(panel.querySelector('.distrun-stacks-head')?.textContent).toContain(dump.heading);
      const items = Array.from(panel.querySelectorAll('li'));
      expect(items.map(li => li.textContent)).toEqual(dump.summary);
      expect(items[0].className).toBe('distrun-stacks-odd');
      expect(panel.querySelector('details pre')?.textContent).toBe('every frame');
      (panel.querySelector('.distrun-stacks-close') as HTMLElement).click();
      expect(panel.style.display).toBe('none');
    } finally {
      globalThis.fetch = original;
    }
  });
});

describe('meters', () => {
  it("draws each rank's CPU under its chip and sparklines in the inspector", () => {
    const m = model('job-meters', 5, 0, ranks(2));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    for (const [cpu0, cpu1] of [
      [98, 0],
      [99, 1],
      [97, 0]
    ]) {
      m.emit('msg:custom', {
        type: 'meters',
        readings: { 'rank-0': [cpu0, 512 * 2 ** 20], 'rank-1': [cpu1, 3 * 2 ** 30] }
      });
    }
    const chip = (key: string) => el.querySelector(`.distrun-rank[data-key="${key}"]`) as HTMLElement;
    expect(chip('rank-0').dataset.cpu).toBe('97');
    expect(chip('rank-1').dataset.cpu).toBe('0');
    expect((chip('rank-0').querySelector('.distrun-cpu-bar') as HTMLElement).style.width).toBe(
      '97%'
    );
    expect(chip('rank-0').title).toContain('CPU 97% · 512 MiB');
    const row = el.querySelector('tr[data-process="rank-1"]') as HTMLElement;
    expect(row.querySelector('.distrun-meter-cpu')?.textContent).toBe('0%');
    expect(row.querySelector('.distrun-meter-memory')?.textContent).toBe('3.0 GiB');
    const points = row.querySelector('.distrun-meter-cpu polyline')?.getAttribute('points');
    expect(points?.split(' ').length).toBe(3);
    expect(el.querySelector('.distrun-meter-gpu')).toBeNull(); // no GPU read, no column
  });

  it("empties a rank's CPU bar once it ended, keeping its last reading in the tooltip", () => {
    const m = model('job-meters-ended', 5, 0, ranks(2));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    m.emit('msg:custom', {
      type: 'meters',
      readings: { 'rank-0': [97, 2 ** 20], 'rank-1': [96, 2 ** 20] }
    });
    const chip = (key: string) => el.querySelector(`.distrun-rank[data-key="${key}"]`) as HTMLElement;
    const bar = (key: string) => (chip(key).querySelector('.distrun-cpu-bar') as HTMLElement).style.width;
    expect([bar('rank-0'), bar('rank-1')]).toEqual(['97%', '96%']);
    m.set('processes', [{ ...ranks(2)[0], state: 'succeeded' }, ranks(2)[1]]);
    m.emit('change:processes');
    expect([bar('rank-0'), bar('rank-1')]).toEqual(['0px', '96%']);
    expect(chip('rank-0').dataset.cpu).toBe('');
    expect(chip('rank-0').title).toMatch(/^rank 0: succeeded.* · CPU 97%/);
  });

  it('adds a GPU column once a reading has one: utilisation where known, memory held', () => {
    const m = model('job-gpu-meters', 5, 0, ranks(2));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const send = (readings: any) => m.emit('msg:custom', { type: 'meters', readings });
    send({ 'rank-0': [90, 2 ** 30], 'rank-1': [3, 2 ** 30] }); // before nvidia-smi's first read
    expect(el.querySelectorAll('th').length).toBeGreaterThan(0);
    expect(Array.from(el.querySelectorAll('th')).map(th => th.textContent)).not.toContain('gpu');
    send({ 'rank-0': [95, 2 ** 30, 88, 10 * 2 ** 30], 'rank-1': [2, 2 ** 30, null, 2 ** 29] });
    expect(Array.from(el.querySelectorAll('th')).map(th => th.textContent)).toContain('gpu');
    const gpu = (key: string) =>
      el.querySelector(`tr[data-process="${key}"] .distrun-meter-gpu`) as HTMLElement;
    expect(gpu('rank-0').textContent).toBe('88% · 10.0 GiB');
    expect(gpu('rank-1').textContent).toBe('512 MiB'); // nvidia-smi said [N/A]
    const chip = el.querySelector('.distrun-rank[data-key="rank-0"]') as HTMLElement;
    expect(chip.title).toContain('CPU 95% · 1.0 GiB · GPU 88% · 10.0 GiB');
  });
});


describe('metrics in the live view', () => {
  it('keeps each rank and metric as a series, thinned by half past its bound', () => {
    const held: any = { metrics: {}, progress: {} };
    const records = Array.from({ length: 9 }, (_, i) => ['rank-0', i, 100 + i, { loss: 9 - i }]);
    keepMetrics(held, records, 8);
    const steps = held.metrics.loss['rank-0'].map((p: number[]) => p[0]);
    expect(steps).toEqual([0, 2, 4, 6, 8]); // every other one, and the last
    keepMetrics(held, [['rank-1', null, 5, null, [3, 10], 1.5]]);
    expect(held.progress).toEqual({ 'rank-1': [3, 10, 1.5] });
    expect(CHART_POINTS).toBe(2000);
  });

  it('draws a line per rank, and the mean with a min-max band above 8 ranks', () => {
    const series = (ranks: number) =>
      Object.fromEntries(
        Array.from({ length: ranks }, (_, r) => [
          `rank-${r}`,
          Array.from({ length: 10 }, (_, i) => [i, 1000 + i, r + i])
        ])
      );
    const few: any = chartOf(series(2));
    expect(few.axis).toBe('step');
    expect(few.lines.map((l: any) => l.key)).toEqual(['rank-0', 'rank-1']);
    expect([few.xmin, few.xmax, few.ymin, few.ymax]).toEqual([0, 9, 0, 10]);
    const many: any = chartOf(series(64));
    expect(many.lines).toBeUndefined();
    expect(many.ranks).toBe(64);
    expect(many.band[0]).toEqual({ x: 0, mean: 31.5, low: 0, high: 63 });
    const timed: any = chartOf({ 'rank-0': [[null, 50, 1], [null, 52, 2]] });
    expect(timed.axis).toBe('time');
    expect(timed.lines[0].points).toEqual([[0, 1], [2, 2]]);
  });

  it('draws 64 ranks of CHART_POINTS each (more points than a call takes arguments)', () => {
    const byKey = Object.fromEntries(
      Array.from({ length: 64 }, (_, r) => [
        `rank-${r}`,
        Array.from({ length: CHART_POINTS }, (_, i) => [i * 5, 1000 + i, r - i / 1000])
      ])
    );
    const chart: any = chartOf(byKey);
    expect([chart.xmin, chart.xmax]).toEqual([0, (CHART_POINTS - 1) * 5]);
    expect([chart.ymin, chart.ymax]).toEqual([-(CHART_POINTS - 1) / 1000, 63]);
    expect(chart.band.length).toBe(200);
  });

  it("says the slowest rank's progress, rate and time left", () => {
    expect(progressOf({})).toBeNull();
    const shown: any = progressOf({ 'rank-0': [50, 100, 10], 'rank-1': [40, 100, 8] });
    expect(shown.text).toBe('40/100 · 8.0 it/s · ETA 0:07');
    expect((progressOf({ 'rank-0': [100, 100, 2] }) as any).text).toBe('100/100 · 2.0 it/s');
    expect((progressOf({ 'rank-0': [1, 10, 0.5] }) as any).text).toContain('2.0 s/it');
    expect([short(0.000012), short(0.41), short(123456)]).toEqual(['1.20e-5', '0.41', '1.23e+5']);
  });
});


describe("each rank's rate", () => {
  const metrics = (rates: number[]) => ({
    loss: Object.fromEntries(
      rates.map((rate, r) => [
        `rank-${r}`,
        Array.from({ length: 11 }, (_, i) => [Math.round(i * rate), 1000 + i, 0.5])
      ])
    )
  });

  it('gives its last step and steps per second', () => {
    const rates: any = stepRates(metrics([4, 2]));
    expect(rates['rank-0']).toEqual({ step: 40, rate: 4, time: 1010 });
    expect(rates['rank-1'].rate).toBe(2);
    expect(stepRates({ loss: { 'rank-0': [[null, 1, 0.5]] } })).toEqual({});
  });

  it("shows each rank's step and rate in its row of the inspector once one reports", () => {
    expect(rankProgress({ 'rank-0': { step: 40, rate: 4, time: 1 } }, ['rank-0'])).toBe(
      'step 40 · 4.0/s'
    );
    expect(rankProgress({ 'rank-0': { step: 1, rate: null, time: 1 } }, ['rank-0'])).toBe('step 1');
    expect(rankProgress({}, ['rank-0'])).toBe('');
    const m = model('job-progress-column', 5, 0, ranks(2));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const heads = () => Array.from(el.querySelectorAll('th')).map(th => th.textContent);
    expect(heads()).not.toContain('progress');
    const records = (upTo: number) =>
      Array.from({ length: upTo }, (_, i) => [
        ['rank-0', 2 * i, 1000 + i, { loss: 1 }],
        ['rank-1', i, 1000 + i, { loss: 1 }]
      ]).flat();
    m.emit('msg:custom', { type: 'metrics', records: records(5), total: 10 });
    expect(heads()).toContain('progress');
    const cell = (key: string) =>
      el.querySelector(`tr[data-process="${key}"] .distrun-rank-progress`)?.textContent;
    expect([cell('rank-0'), cell('rank-1')]).toEqual(['step 8 · 2.0/s', 'step 4 · 1.0/s']);
    m.emit('msg:custom', { type: 'metrics', records: [['rank-1', 9, 1010, { loss: 1 }]], total: 11 });
    expect(cell('rank-1')).toBe('step 9 · 0.9/s'); // 9 steps in 10 s
  });

  it('puts round values on the axes, and a log y axis on a loss that spans ten times', () => {
    expect(ticksOf(0, 1)).toEqual([0, 0.2, 0.4, 0.6, 0.8, 1]);
    expect(ticksOf(0.13, 0.97)).toEqual([0.2, 0.4, 0.6, 0.8]);
    expect(ticksOf(-3, 7)).toEqual([-2, 0, 2, 4, 6]);
    expect(ticksOf(0, 3, 4, true)).toEqual([0, 1, 2, 3]); // steps: never 0.5
    expect(ticksOf(0, 9999, 4, true)).toEqual([0, 2000, 4000, 6000, 8000]);
    expect(ticksOf(5, 5)).toEqual([5]);
    expect(ticksOf(Infinity, -Infinity)).toEqual([]);
    const loss = { ymin: 0.01, ymax: 2.5 };
    expect(defaultScale('train/loss', loss)).toBe('log');
    expect(defaultScale('loss', { ymin: 0.5, ymax: 2.5 })).toBe('linear'); // under ten times
    expect(defaultScale('loss', { ymin: -1, ymax: 2.5 })).toBe('linear'); // not all above 0
    expect(defaultScale('lr', loss)).toBe('linear');
    const log: any = yAxisOf(loss, 'log');
    expect(log.log).toBe(true);
    expect(log.ticks).toEqual([0.01, 0.1, 1]);
    expect([log.lo, log.hi]).toEqual([-2, Math.log10(2.5)]);
    expect(yAxisOf({ ymin: 2, ymax: 5 }, 'log').ticks).toEqual([2, 3, 4, 5]); // no power inside
    const refused: any = yAxisOf({ ymin: 0, ymax: 5 }, 'log'); // 0 has no log
    expect([refused.log, refused.ticks]).toEqual([false, [0, 1, 2, 3, 4, 5]]);
  });

  it('labels each chart\'s axes and switches its y axis between log and linear', () => {
    const m = model('job-axes', 5, 0, ranks(1));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const records = Array.from({ length: 101 }, (_, i) => [
      'rank-0', i, 1000 + i, { loss: 10 / (i + 1), acc: i / 100 }
    ]);
    m.emit('msg:custom', { type: 'metrics', records, total: records.length });
    const chart = (name: string) => el.querySelector(`.distrun-chart[data-metric="${name}"]`)!;
    const texts = (name: string, cls: string) =>
      Array.from(chart(name).querySelectorAll(cls)).map(n => n.textContent);
    expect(texts('loss', '.distrun-chart-ytick')).toEqual(['0.1', '1', '10']);
    expect(texts('loss', '.distrun-chart-xtick')).toEqual(['0', '20', '40', '60', '80', '100']);
    expect(texts('acc', '.distrun-chart-ytick')).toEqual(['0', '0.2', '0.4', '0.6', '0.8', '1']);
    expect(chart('loss').querySelectorAll('.distrun-chart-grid')).toHaveLength(3);
    const scale = (name: string) => chart(name).querySelector('.distrun-chart-scale') as HTMLButtonElement;
    expect([scale('loss').textContent, scale('acc').textContent]).toEqual(['log', 'linear']);
    expect(scale('acc').disabled).toBe(true); // a 0 among its values
    scale('loss').click();
    expect(scale('loss').textContent).toBe('linear');
    expect(texts('loss', '.distrun-chart-ytick')).toEqual(['2', '4', '6', '8', '10']);
    m.emit('msg:custom', { type: 'metrics', records: [['rank-0', 101, 1101, { loss: 0.09, acc: 1 }]],
      total: 102 });
    expect(scale('loss').textContent).toBe('linear'); // kept as picked, when new values come
  });

  it('draws at most MOST_CHARTS charts, the first by name, and says how many there are', () => {
    const m = model('job-many-metrics', 5, 0, ranks(1));
    live.initialize({ model: m });
    const el = document.createElement('div');
    live.render({ model: m, el });
    const names = Array.from({ length: 300 }, (_, i) => `layer${String(i).padStart(3, '0')}`);
    const values = Object.fromEntries(names.map((name, i) => [name, i]));
    m.emit('msg:custom', { type: 'metrics', records: [['rank-0', 1, 1000, values]], total: 1 });
    expect(el.querySelectorAll('.distrun-chart')).toHaveLength(MOST_CHARTS);
    expect(el.querySelector('.distrun-charts-more')?.textContent).toBe(
      `${MOST_CHARTS} of 300 metrics drawn (the first by name); ` +
        '`jupyter distrun metrics job-many-metrics` lists every one'
    );
  });

  it('names a rank 20% or more below the median only once it stays so', () => {
    const since = {};
    const rates = stepRates(metrics([4, 4, 4, 3]));
    expect(slowRanks(rates, since, 0)).toEqual([]); // slow, but not for long yet
    const named = slowRanks(rates, since, SLOW_FOR_S);
    expect(named).toEqual([{ key: 'rank-3', rate: 3, median: 4 }]);
    expect(slowRanks(stepRates(metrics([4, 4, 4, 3.5])), since, SLOW_FOR_S + 1)).toEqual([]);
    expect(since).toEqual({}); // back within 20%: forgotten
  });
});
