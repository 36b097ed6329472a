import './jsdom'; // first: before @lumino/widgets loads
import { DistrunApi, IJobSummary } from '../api';
import { DistrunSidebar } from '../sidebar';

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
