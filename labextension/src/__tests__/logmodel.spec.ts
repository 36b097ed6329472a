import { ILogLine, ILogRange } from '../api';
import { keyLabel, LogBuffer, LogModel, sortKeys } from '../logmodel';

function range(from: number, count: number, next: string): ILogRange {
  const lines: ILogLine[] = [];
  for (let i = from; i < from + count; i++) {
    lines.push({ ts: `t${i}`, stream: i % 10 === 0 ? 'stderr' : 'stdout', text: `line ${i}` });
  }
  return { key: 'rank-0', lines, next, state: 'running' };
}

describe('LogBuffer', () => {
  it('keeps every line while under its bound, and the cursor of the last range', () => {
    const buffer = new LogBuffer(100);
    expect(buffer.cursor).toBeUndefined();
    buffer.append(range(0, 40, '400.0'));
    buffer.append(range(40, 40, '800.0'));
    expect(buffer.lines.map(l => l.text)).toEqual(
      Array.from({ length: 80 }, (_, i) => `line ${i}`)
    );
    expect(buffer.dropped).toBe(0);
    expect(buffer.cursor).toBe('800.0');
  });

  it('lets the oldest lines go past its bound and counts them', () => {
    const buffer = new LogBuffer(100);
    for (let i = 0; i < 10; i++) {
      buffer.append(range(i * 30, 30, `${i}.0`));
    }
    expect(buffer.lines).toHaveLength(100);
    expect(buffer.lines[0].text).toBe('line 200');
    expect(buffer.lines[99].text).toBe('line 299');
    expect(buffer.dropped).toBe(200);
  });

  it('returns at most its bound of new lines from one huge range', () => {
    const buffer = new LogBuffer(10);
    const added = buffer.append(range(0, 25, '1.0'));
    expect(added.map(l => l.text)).toEqual(buffer.lines.map(l => l.text));
    expect(added[0].text).toBe('line 15');
  });
});

describe('LogModel', () => {
  it('holds a bounded buffer per key', () => {
    const model = new LogModel(5);
    model.buffer('rank-1').append(range(0, 8, '1.0'));
    model.buffer('rank-0').append(range(0, 3, '1.0'));
    expect(model.keys).toEqual(['rank-1', 'rank-0']);
    expect(model.size).toBe(8);
    expect(model.buffer('rank-1')).toBe(model.buffer('rank-1'));
  });
});

describe('log keys', () => {
  it('sort as people count and read as labels', () => {
    expect(sortKeys(['rank-10', 'rank-2', 'mpirun', 'rank-0', 'worker-1'])).toEqual([
      'mpirun',
      'rank-0',
      'rank-2',
      'rank-10',
      'worker-1'
    ]);
    expect(keyLabel('rank-3')).toBe('rank 3');
    expect(keyLabel('mpirun')).toBe('mpirun');
  });
});
