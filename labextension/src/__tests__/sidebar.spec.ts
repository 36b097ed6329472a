import './jsdom'; // first: before @lumino/widgets loads
import { DistrunApi, IJobSummary } from '../api';
import { DistrunSidebar } from '../sidebar';
import { pausedText } from '../dom';

function job(n: number): IJobSummary {
  return {
    job_id: `job-${n}`,
    name: '',
    type: 'pytorch',
    state: 'succeeded',
    nodes: ['local0'],
    processes: 2,
    world_size: 2,
    started: 1000,
    ended: 1010,
    root_cause: null,
    message: null
  };
}

/** A sidebar over a store of `count` jobs (newest first) that honours `?limit=`. */
function sidebarOver(count: number, jobsShown: number) {
  const paths: string[] = [];
  const store = Array.from({ length: count }, (_, i) => job(count - i));
  const api = new DistrunApi(async path => {
    paths.push(path);
    const limit = new URLSearchParams(path.split('?')[1] ?? '').get('limit');
    return { status: 200, body: limit === null ? store : store.slice(0, Number(limit)) };
  });
  const sidebar = new DistrunSidebar({ api, openLogs: () => undefined, jobsShown });
  return { sidebar, paths };
}

async function listed(sidebar: DistrunSidebar) {
  await (sidebar as any).refreshJobs();
  const node = sidebar.node;
  const ids = [...node.querySelectorAll('.jp-distrun-job')].map(e => e.getAttribute('data-job-id'));
  const older = node.querySelector('.jp-distrun-older')?.textContent ?? null;
  sidebar.dispose();
  return { ids, older };
}

describe('DistrunSidebar job list', () => {
  it('asks for one job more than it shows and says when older ones are left out', async () => {
    const { sidebar, paths } = sidebarOver(5, 3);
    const { ids, older } = await listed(sidebar);
    expect(paths).toEqual(['jobs?limit=4']);
    expect(ids).toEqual(['job-5', 'job-4', 'job-3']);
    expect(older).toBe('Only the newest 3 jobs are shown; `jupyter distrun jobs` lists them all.');
  });

  it('lists every job, without the note, when they all fit', async () => {
    const { ids, older } = await listed(sidebarOver(3, 3).sidebar);
    expect(ids).toEqual(['job-3', 'job-2', 'job-1']);
    expect(older).toBeNull();
  });
});

describe('DistrunSidebar stacks', () => {
  it("reads a running job's stacks and keeps them shown across polls until closed", async () => {
    const running = { ...job(1), state: 'running', ended: null };
    const asked: string[] = [];
    const api = new DistrunApi(async (path, init) => {
      asked.push(`${init.method} ${path}`);
      if (path.endsWith('/stacks')) {
        return {
          status: 200,
          body: {
            job_id: 'job-1',
            taken: 1,
            heading: 'Stacks of job job-1: 2 Python processes on 1 node',
            summary: ['rank 1 (local0): train.py:6 in load_batch', 'rank 0 (local0): all_reduce'],
            text: 'every frame'
          }
        };
      }
      return { status: 200, body: [running] };
    });
    const sidebar = new DistrunSidebar({ api, openLogs: () => undefined });
    await (sidebar as any).refreshJobs();
    const button = sidebar.node.querySelector('.jp-distrun-stacks-button') as HTMLButtonElement;
    expect(button.textContent).toBe('Stacks');
    await (sidebar as any).readStacks('job-1');
    await (sidebar as any).refreshJobs(); // a later poll redraws the list: the stacks stay
    expect(asked).toContain('POST jobs/job-1/stacks');
    const box = sidebar.node.querySelector('.jp-distrun-stacks') as HTMLElement;
    expect(box.querySelector('.jp-distrun-stacks-head')?.textContent).toContain('2 Python');
    const items = [...box.querySelectorAll('li')];
    expect(items.map(li => li.textContent)).toEqual([
      'rank 1 (local0): train.py:6 in load_batch',
      'rank 0 (local0): all_reduce'
    ]);
    expect(items[0].className).toBe('jp-distrun-stacks-odd');
    (box.querySelector('button') as HTMLButtonElement).click();
    await (sidebar as any).refreshJobs();
    expect(sidebar.node.querySelector('.jp-distrun-stacks')).toBeNull();
    sidebar.dispose();
  });

  it('marks a running job that looks stuck', async () => {
    const stuck = {
      ...job(1),
      state: 'running',
      stalled: 'looks stuck: no rank printed or used CPU for 300 s'
    };
    const api = new DistrunApi(async () => ({ status: 200, body: [stuck, job(2)] }));
    const sidebar = new DistrunSidebar({ api, openLogs: () => undefined });
    await (sidebar as any).refreshJobs();
    const marks = [...sidebar.node.querySelectorAll('.jp-distrun-stalled')];
    expect(marks.map(m => m.textContent)).toEqual([
      'Looks stuck: no rank printed or used CPU for 300 s'
    ]);
    expect(marks[0].closest('.jp-distrun-job')?.getAttribute('data-job-id')).toBe('job-1');
    sidebar.dispose();
  });

  it("lists each node's pools with their modules, memory and idle time", async () => {
    const pools = {
      nodes: [
        {
          node: 'node0',
          pools: [
            { modules: ['torch'], pid: 7, ranks: 0, rss: 300 * 2 ** 20, idle: 42.4, idle_limit: 600, age: 90 },
            { modules: ['json'], pid: 8, ranks: 2, rss: null, idle: 0, idle_limit: 600, age: 5 }
          ],
          problem: null
        },
        { node: 'node1', pools: [], problem: 'cannot connect' }
      ]
    };
    const api = new DistrunApi(async path => ({ status: 200, body: path === 'nodes/pools' ? pools : [] }));
    const sidebar = new DistrunSidebar({ api, openLogs: () => undefined });
    await (sidebar as any).refreshPools();
    const rows = [...sidebar.node.querySelectorAll('.jp-distrun-pools tr')];
    expect(rows.map(row => [...row.querySelectorAll('td')].map(td => td.textContent))).toEqual([
      ['node0', 'torch', '300 MiB', 'idle 42 s of 600'],
      ['node0', 'json', '', '2 ranks']
    ]);
    expect(sidebar.node.querySelector('.jp-distrun-pools')?.textContent).toContain(
      'node1: pools not read (cannot connect)'
    );
    await (sidebar as any).renderPools({ nodes: [{ node: 'this machine', pools: [], problem: null }] });
    expect(sidebar.node.querySelector('.jp-distrun-pools')?.textContent).toBe('');
    sidebar.dispose();
  });

  it('says which ranks of a running job wait in their debugger', async () => {
    const paused = { ...job(1), state: 'running', paused: [1, 3] };
    const many = { ...job(2), state: 'running', paused: [0, 1, 2, 3, 4, 5] };
    const api = new DistrunApi(async () => ({ status: 200, body: [paused, many, job(3)] }));
    const sidebar = new DistrunSidebar({ api, openLogs: () => undefined });
    await (sidebar as any).refreshJobs();
    const marks = [...sidebar.node.querySelectorAll('.jp-distrun-paused')];
    expect(marks.map(m => m.textContent)).toEqual([
      'Paused in the debugger: ranks 1 and 3',
      'Paused in the debugger: ranks 0, 1, 2, 3 and 2 more'
    ]);
    expect(pausedText([7])).toBe('rank 7');
    sidebar.dispose();
  });

  it("shows a restarting job's attempt, why it waits and each earlier cause, with Cancel", async () => {
    const restarting = {
      ...job(1),
      state: 'restarting',
      ended: null,
      message: 'attempt 1 failed; attempt 2 of 3 starts in 3 s',
      attempt: 'attempt 2 of 3',
      attempts: ['attempt 1 (4.2 s): rank 1 on local1 (127.0.0.1) was killed by SIGKILL']
    };
    const api = new DistrunApi(async () => ({ status: 200, body: [restarting, job(2)] }));
    const sidebar = new DistrunSidebar({ api, openLogs: () => undefined });
    await (sidebar as any).refreshJobs();
    const row = sidebar.node.querySelector('[data-job-id="job-1"]') as HTMLElement;
    expect(row.querySelector('.jp-distrun-attempt')?.textContent).toBe('attempt 2 of 3');
    expect(row.textContent).toContain('attempt 2 of 3 starts in 3 s');
    expect(
      [...row.querySelectorAll('.jp-distrun-earlier-attempt')].map(e => e.textContent)
    ).toEqual(['attempt 1 (4.2 s): rank 1 on local1 (127.0.0.1) was killed by SIGKILL']);
    expect(row.querySelector('.jp-distrun-cancel')).not.toBeNull();
    const other = sidebar.node.querySelector('[data-job-id="job-2"]') as HTMLElement;
    expect(other.querySelector('.jp-distrun-attempt')).toBeNull();
    sidebar.dispose();
  });

  it("shows a running job's progress and latest metrics, and none once it ended", async () => {
    const running = {
      ...job(1),
      state: 'running',
      ended: null,
      progress: '340/1000',
      metrics: { loss: 0.412345, lr: 0.00005 }
    };
    const ended = { ...job(2), metrics: { loss: 0.1 } };
    const api = new DistrunApi(async () => ({ status: 200, body: [running, ended] }));
    const sidebar = new DistrunSidebar({ api, openLogs: () => undefined });
    await (sidebar as any).refreshJobs();
    const lines = [...sidebar.node.querySelectorAll('.jp-distrun-metrics')];
    expect(lines.map(l => l.textContent)).toEqual(['340/1000 · loss 0.412 · lr 5.0e-5']);
    expect(lines[0].closest('.jp-distrun-job')?.getAttribute('data-job-id')).toBe('job-1');
    sidebar.dispose();
  });

  it('names a metric that went to NaN or infinity, as the server sends it', async () => {
    const running = { ...job(1), state: 'running', ended: null, metrics: { loss: 'NaN', ppl: 'Infinity', lr: 0.1 } };
    const api = new DistrunApi(async () => ({ status: 200, body: [running] }));
    const sidebar = new DistrunSidebar({ api, openLogs: () => undefined });
    await (sidebar as any).refreshJobs();
    const lines = [...sidebar.node.querySelectorAll('.jp-distrun-metrics')];
    expect(lines.map(l => l.textContent)).toEqual(['loss NaN · ppl Infinity · lr 0.1']);
    sidebar.dispose();
  });

  it('says in one line why stacks could not be read', async () => {
    const api = new DistrunApi(async path =>
      path.endsWith('/stacks')
        ? { status: 400, body: { message: 'job job-1 is succeeded; stacks are read from a running job' } }
        : { status: 200, body: [{ ...job(1), state: 'running' }] }
    );
    const sidebar = new DistrunSidebar({ api, openLogs: () => undefined });
    await (sidebar as any).readStacks('job-1');
    await (sidebar as any).refreshJobs();
    expect(sidebar.node.querySelector('.jp-distrun-stacks .jp-distrun-error')?.textContent).toBe(
      'job job-1 is succeeded; stacks are read from a running job'
    );
    sidebar.dispose();
  });
});

describe('DistrunSidebar node meters', () => {
  const idle = [null, 1, 0, 1];
  const busy = [null, 98, 100, 99];
  const rss = [null, 2 ** 30, 2 ** 30, 1.5 * 2 ** 30];

  async function shown(nodes: any, usage: any) {
    const api = new DistrunApi(async path => ({
      status: 200,
      body: path === 'nodes' ? nodes : usage
    }));
    const sidebar = new DistrunSidebar({ api, openLogs: () => undefined });
    await (sidebar as any).refreshNodes();
    await (sidebar as any).refreshUsage();
    const rows = [...sidebar.node.querySelectorAll('.jp-distrun-nodes tr')].map(tr => ({
      node: tr.getAttribute('data-node'),
      meter: tr.querySelector('.jp-distrun-meter')
    }));
    sidebar.dispose();
    return rows;
  }

  it('draws each busy node a CPU line with its latest share, and nothing where no job runs', async () => {
    const health = (name: string) => ({
      name, host: '10.0.0.1', port: 22, status: 'ok', latency_ms: 3, python: '3.11',
      hostname: name, gpus: null, problem: null
    });
    const rows = await shown(
      { source: 'nodes.yml', local: false, nodes: [health('node0'), health('node1')] },
      { bucket: 5, nodes: { node0: { cpu: busy, rss } } }
    );
    expect(rows.map(r => r.node)).toEqual(['node0', 'node1']);
    const meter = rows[0].meter as HTMLElement;
    expect(meter.textContent).toBe('99%');
    expect(meter.title).toContain('CPU 99% of one core, memory 1.5 GiB');
    const line = meter.querySelector('svg polyline') as SVGPolylineElement;
    expect(line.getAttribute('points')?.split(' ')).toHaveLength(3); // the gap is left out
    expect(rows[1].meter?.textContent).toBe('');
    expect(meter.title).not.toContain('GPU');
  });

  it("adds a node's GPU memory to its meter's title where nvidia-smi read any", async () => {
    const rows = await shown(
      { source: null, local: true, nodes: [] },
      { bucket: 5, nodes: { local0: { cpu: busy, rss, gpu: [null, 2 ** 30, 3 * 2 ** 30] } } }
    );
    expect((rows[0].meter as HTMLElement).title).toContain('memory 1.5 GiB, GPU memory 3.0 GiB');
  });

  it('lists local nodes while a job runs on them, the idle one beside the busy one', async () => {
    const rows = await shown(
      { source: null, local: true, nodes: [] },
      { bucket: 5, nodes: { local1: { cpu: idle, rss }, local0: { cpu: busy, rss } } }
    );
    expect(rows.map(r => [r.node, r.meter?.textContent])).toEqual([
      ['local0', '99%'],
      ['local1', '1%']
    ]);
  });
});
