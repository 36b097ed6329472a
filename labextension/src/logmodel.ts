/**
 * The lines of one job's logs held in the browser: one bounded buffer per log key (a rank
 * or a process), fed range by range from the server. The full log stays on disk; here only
 * the newest `maxLines` lines per key are kept, and how many were let go is counted.
 */

import { ILogLine, ILogRange } from './api';

export class LogBuffer {
  readonly lines: ILogLine[] = [];
  /** How many older lines were let go to stay within the bound. */
  dropped = 0;
  /** Where the next read starts: the `next` of the last range received. */
  cursor: string | undefined = undefined;

  constructor(readonly maxLines: number) {}

  /** Add a range from the server; returns the lines that were added. */
  append(range: ILogRange): ILogLine[] {
    this.cursor = range.next;
    const added = range.lines;
    for (const line of added) {
      this.lines.push(line);
    }
    const excess = this.lines.length - this.maxLines;
    if (excess > 0) {
      this.lines.splice(0, excess);
      this.dropped += excess;
    }
    return added.length > this.maxLines ? added.slice(-this.maxLines) : added;
  }
}

export class LogModel {
  private readonly buffers = new Map<string, LogBuffer>();

  constructor(readonly maxLinesPerKey = 10000) {}

  buffer(key: string): LogBuffer {
    let found = this.buffers.get(key);
    if (!found) {
      found = new LogBuffer(this.maxLinesPerKey);
      this.buffers.set(key, found);
    }
    return found;
  }

  get keys(): string[] {
    return [...this.buffers.keys()];
  }

  /** Lines held over every key: never more than keys x maxLinesPerKey. */
  get size(): number {
    let total = 0;
    for (const buffer of this.buffers.values()) {
      total += buffer.lines.length;
    }
    return total;
  }
}

/** "rank-3" -> "rank 3", "worker-1" -> "worker 1", "mpirun" -> "mpirun". */
export function keyLabel(key: string): string {
  return key.replace(/-(\d+)$/, ' $1');
}

/** Sort log keys as people count: rank-2 before rank-10. */
export function sortKeys(keys: string[]): string[] {
  const parse = (key: string): [string, number] => {
    const match = /^(.*)-(\d+)$/.exec(key);
    return match ? [match[1], Number(match[2])] : [key, -1];
  };
  return [...keys].sort((a, b) => {
    const [ha, na] = parse(a);
    const [hb, nb] = parse(b);
    return ha === hb ? na - nb : ha < hb ? -1 : 1;
  });
}
