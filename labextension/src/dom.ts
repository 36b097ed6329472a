/** A tiny DOM builder: every text goes in as textContent, never as HTML. */

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: { [name: string]: string } = {},
  ...children: (Node | string | null | undefined)[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    element.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      element.append(typeof child === 'string' ? document.createTextNode(child) : child);
    }
  }
  return element;
}

/** A sparkline of `values` (oldest first; null: a gap) as an SVG line scaled to `top` or
 * the highest value, drawn by CSS (`.jp-distrun-spark polyline`). */
export function sparkline(
  values: (number | null)[],
  top: number,
  width = 48,
  height = 14
): SVGSVGElement {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'jp-distrun-spark');
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  const known = values.filter((v): v is number => v !== null);
  const high = Math.max(top, ...known, 1e-9);
  const step = width / Math.max(values.length - 1, 1);
  const y = (v: number) => (height - 1 - (v / high) * (height - 2)).toFixed(1);
  const points = values
    .map((v, i) => (v === null ? null : `${(i * step).toFixed(1)},${y(v)}`))
    .filter((p): p is string => p !== null);
  const line = document.createElementNS(ns, 'polyline');
  line.setAttribute('points', points.join(' '));
  svg.appendChild(line);
  return svg;
}

/** "212 MiB", "1.5 GiB". */
export function memory(bytes: number): string {
  const mib = bytes / 2 ** 20;
  return mib >= 1024 ? `${(mib / 1024).toFixed(1)} GiB` : `${Math.round(mib)} MiB`;
}

/** "12.3s" or "4.2m" between two epoch times in seconds (the second defaults to now). */
export function duration(started: number | null, ended: number | null): string {
  if (!started) {
    return '';
  }
  const seconds = (ended ?? Date.now() / 1000) - started;
  return seconds < 90 ? `${seconds.toFixed(1)}s` : `${(seconds / 60).toFixed(1)}m`;
}

/** "1 rank", "4 ranks", "2 processes". */
export function plural(count: number, noun: string): string {
  const many = /(s|sh|ch)$/.test(noun) ? `${noun}es` : `${noun}s`;
  return `${count} ${count === 1 ? noun : many}`;
}

/** The ranks a job has paused in their debugger: "rank 3", "ranks 1 and 3", "ranks 0, 1,
 * 2, 3 and 2 more". */
export function pausedText(ranks: number[]): string {
  const most = 4;
  if (ranks.length === 1) {
    return `rank ${ranks[0]}`;
  }
  if (ranks.length > most) {
    return `ranks ${ranks.slice(0, most).join(', ')} and ${ranks.length - most} more`;
  }
  return `ranks ${ranks.slice(0, -1).join(', ')} and ${ranks[ranks.length - 1]}`;
}
