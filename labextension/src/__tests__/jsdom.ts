// jsdom has no DragEvent, which @lumino/dragdrop (under @lumino/widgets) uses when it loads.
if (typeof (globalThis as any).DragEvent === 'undefined') {
  (globalThis as any).DragEvent = class DragEvent extends MouseEvent {};
}
export {};
