import { ApiError, DistrunApi, IReply } from '../api';

/** A requester that records each call and answers from a table. */
function recorder(answers: { [path: string]: IReply }) {
  const calls: { path: string; method: string }[] = [];
  const request = async (path: string, init: { method: string }) => {
    calls.push({ path, method: init.method });
    const answer = answers[path];
    if (!answer) {
      return { status: 404, body: { message: `no route ${path}` } };
    }
    return answer;
  };
  return { calls, api: new DistrunApi(request) };
}

describe('DistrunApi', () => {
  it('lists jobs and reads one, escaping the id', async () => {
    const { calls, api } = recorder({
      jobs: { status: 200, body: [{ job_id: 'a' }] },
      'jobs/a%2Fb': { status: 200, body: { job_id: 'a/b' } }
    });
    expect(await api.jobs()).toEqual([{ job_id: 'a' }]);
    await expect(api.jobs(101)).rejects.toThrow('no route jobs?limit=101');
    expect((await api.job('a/b')).job_id).toBe('a/b');
    expect(calls).toEqual([
      { path: 'jobs', method: 'GET' },
      { path: 'jobs?limit=101', method: 'GET' },
      { path: 'jobs/a%2Fb', method: 'GET' }
    ]);
  });

  it('asks for log ranges by rank number or process name, with cursor and tail', async () => {
    const { calls, api } = recorder({});
    await expect(api.logs('j', 'rank-3', { offset: '10.4' })).rejects.toThrow('no route');
    await expect(api.logs('j', 'mpirun', { tail: 50, limit: 10 })).rejects.toThrow();
    expect(calls.map(c => c.path)).toEqual([
      'jobs/j/logs?rank=3&offset=10.4',
      'jobs/j/logs?rank=mpirun&tail=50&limit=10'
    ]);
  });

  it('turns an error reply into an ApiError with the server message', async () => {
    const { api } = recorder({ jobs: { status: 500, body: { message: 'store unreadable' } } });
    const error = await api.jobs().catch(e => e);
    expect(error).toBeInstanceOf(ApiError);
    expect(error.status).toBe(500);
    expect(error.message).toBe('store unreadable');
  });

  it('cancels with POST and accepts the running, ended and lost answers', async () => {
    const { calls, api } = recorder({
      'jobs/r/cancel': { status: 202, body: { state: 'running', message: 'asked to stop' } },
      'jobs/e/cancel': { status: 200, body: { state: 'failed', message: 'already ended' } },
      'jobs/l/cancel': { status: 409, body: { state: 'lost', message: 'no owner' } }
    });
    expect((await api.cancel('r')).message).toBe('asked to stop');
    expect((await api.cancel('e')).state).toBe('failed');
    expect((await api.cancel('l')).state).toBe('lost');
    expect(calls.every(c => c.method === 'POST')).toBe(true);
    await expect(api.cancel('missing')).rejects.toBeInstanceOf(ApiError);
  });
});
