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
