/**
 * The client of the server extension's REST API (/distrun/...). Every call goes through
 * one `Requester`, so the same code runs against the real server (ServerConnection, which
 * adds the token and XSRF header) and, in unit tests, against a plain function.
 */

export interface IJobSummary {
  job_id: string;
  name: string;
  type: string;
  state: string; // pending, running, succeeded, failed, cancelled, timed_out, lost
  nodes: string[];
  processes: number;
  world_size: number | null;
  started: number | null;
  ended: number | null;
  root_cause: string | null;
  message: string | null;
  stalled?: string | null; // "looks stuck: no rank printed or used CPU for 300 s"
  paused?: number[]; // the ranks waiting in their debugger now (breakpoint, post-mortem)
  attempt?: string | null; // "attempt 2 of 4" once a job started again after a failure
  attempts?: string[]; // each earlier attempt's cause, one line each
  // A running job's: each metric's latest (rank mean); one that is not finite is named:
  // "NaN", "Infinity" or "-Infinity" (JSON has no such numbers).
  metrics?: { [name: string]: number | string };
  progress?: string; // a running job's: "340/1000", its slowest rank's progress bar
}

export interface IProcessRow {
  process: string;
  role: string;
  host: string;
  node_rank: number;
  local_rank: number | string;
  rank: string;
  world_size: number;
  master: string;
  tf_config: string;
  status: string;
  exit: number | string;
}

/** One job in full: the list's count of processes becomes a row per process. */
export interface IJobDetail extends Omit<IJobSummary, 'processes'> {
  spec: string;
  processes: IProcessRow[];
  log_keys: string[];
  store_path: string;
}

export interface INodeHealth {
  name: string;
  host: string;
  port: number;
  status: string;
  latency_ms: number | null;
  python: string | null;
  hostname: string | null;
  gpus: number | null;
  problem: string | null;
}

export interface INodes {
  source: string | null;
  local: boolean;
  nodes: INodeHealth[];
}

/** Each node's CPU (% of one core) and resident bytes over the last minutes, oldest first,
 * summed over the running jobs' processes on it (null: no report in that interval). */
export interface INodeUsage {
  bucket: number; // seconds per point
  // gpu: bytes held on GPUs, where the nodes' nvidia-smi read any
  nodes: {
    [node: string]: { cpu: (number | null)[]; rss: (number | null)[]; gpu?: (number | null)[] };
  };
}

/** Each node's pools of pre-imported Python (--preload; node_side/pool.py's rows). */
export interface INodePools {
  nodes: {
    node: string; // "this machine" without an inventory
    pools: {
      modules: string[];
      pid: number;
      ranks: number; // running now
      rss: number | null; // resident bytes
      idle: number; // seconds without a rank
      idle_limit?: number | null; // when it ends itself
      age: number; // seconds since it started
    }[];
    problem: string | null;
  }[];
}

export interface ILogLine {
  ts: string;
  stream: 'stdout' | 'stderr';
  text: string;
}

export interface ILogRange {
  key: string;
  lines: ILogLine[];
  next: string;
  state: string;
}

/** Every rank's Python stack, grouped (diagnose/stacks.py): a line per group, odd ones first. */
export interface IStacks {
  job_id: string;
  taken: number;
  heading: string;
  summary: string[];
  text: string;
}

/** What a request returns: a status and a JSON body (or an error body with `message`). */
export interface IReply {
  status: number;
  body: any;
}

export type Requester = (path: string, init: { method: string }) => Promise<IReply>;

export const FINAL_STATES = ['succeeded', 'failed', 'cancelled', 'timed_out', 'lost'];

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

export class DistrunApi {
  constructor(private readonly request: Requester) {}

  /** Jobs, newest first: all of them, or the newest `limit`. */
  jobs(limit?: number): Promise<IJobSummary[]> {
    return this.get(limit === undefined ? 'jobs' : `jobs?limit=${limit}`);
  }

  job(jobId: string): Promise<IJobDetail> {
    return this.get(`jobs/${encodeURIComponent(jobId)}`);
  }

  nodes(): Promise<INodes> {
    return this.get('nodes');
  }

  nodeUsage(): Promise<INodeUsage> {
    return this.get('nodes/usage');
  }

  pools(): Promise<INodePools> {
    return this.get('nodes/pools');
  }

  /** A range of one log: after `offset` (the `next` of the last range), or its last `tail` lines. */
  logs(
    jobId: string,
    key: string,
    options: { offset?: string; tail?: number; limit?: number } = {}
  ): Promise<ILogRange> {
    const params = new URLSearchParams({ rank: key.startsWith('rank-') ? key.slice(5) : key });
    if (options.offset !== undefined) {
      params.set('offset', options.offset);
    }
    if (options.tail !== undefined) {
      params.set('tail', String(options.tail));
    }
    if (options.limit !== undefined) {
      params.set('limit', String(options.limit));
    }
    return this.get(`jobs/${encodeURIComponent(jobId)}/logs?${params.toString()}`);
  }

  /** Ask the job's owner to stop it; resolves to the state the server reports. */
  async cancel(jobId: string): Promise<{ state: string; message: string }> {
    return this.call('POST', `jobs/${encodeURIComponent(jobId)}/cancel`, [200, 202, 409]);
  }

  /** Every rank's stack, read now by the job's owner (a running job only). */
  stacks(jobId: string): Promise<IStacks> {
    return this.call('POST', `jobs/${encodeURIComponent(jobId)}/stacks`, [200]);
  }

  private get<T>(path: string): Promise<T> {
    return this.call('GET', path, [200]);
  }

  private async call(method: string, path: string, ok: number[]): Promise<any> {
    const reply = await this.request(path, { method });
    if (!ok.includes(reply.status)) {
      const message = (reply.body && reply.body.message) || `HTTP ${reply.status}`;
      throw new ApiError(reply.status, message);
    }
    return reply.body;
  }
}

/** The requester for a running Jupyter server. */
export function serverRequester(): Requester {
  // Imported lazily so the unit tests need no JupyterLab packages.
  return async (path, init) => {
    const { ServerConnection } = await import('@jupyterlab/services');
    const { URLExt } = await import('@jupyterlab/coreutils');
    const settings = ServerConnection.makeSettings();
    const url = URLExt.join(settings.baseUrl, 'distrun', path);
    const response = await ServerConnection.makeRequest(url, init, settings);
    const text = await response.text();
    let body: any = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = { message: text };
    }
    return { status: response.status, body };
  };
}
