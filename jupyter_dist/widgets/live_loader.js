// What each live view's model carries as its module (anywidget's `_esm`): a loader of the
// view's real code, live.js and live.css, which the kernel sends once, in its one LiveCode
// widget (`_code` names it), not in every cell's view (68 KB each, parsed and compiled
// again for every cell). A page loads each LiveCode's code once and hands it every view.
// Plain ESM, no imports, as anywidget loads it.

// LiveCode model id -> Promise of live.js's module. On the page, not in this module, which
// anywidget may load once per view.
const LOADED = (globalThis.__jupyterDistLiveCode ??= new Map());
const STYLE_ID = "jupyter-dist-live-css";

function addStyle(css) {
  let style = document.getElementById(STYLE_ID);
  if (!style) {
    style = Object.assign(document.createElement("style"), { id: STYLE_ID });
    document.head.appendChild(style);
  }
  if (style.textContent !== css) style.textContent = css;
}

async function importCode(source) {
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  try {
    return await import(/* webpackIgnore: true */ /* @vite-ignore */ url);
  } finally {
    URL.revokeObjectURL(url);
  }
}

// live.js's module for the view whose model this is: its LiveCode's, loaded once.
export function liveCode(model, load = importCode) {
  const id = model.get("_code");
  if (!LOADED.has(id)) {
    const loading = (async () => {
      const code = await model.widget_manager.get_model(id);
      addStyle(code.get("style"));
      return load(code.get("code"));
    })();
    LOADED.set(id, loading);
    loading.catch(() => LOADED.delete(id)); // a later view asks again
  }
  return LOADED.get(id);
}

async function initialize(context) {
  let live;
  try {
    live = await liveCode(context.model);
  } catch {
    return; // said by render, where there is a place to say it
  }
  return live.default.initialize?.(context);
}

async function render(context) {
  let live;
  try {
    live = await liveCode(context.model);
  } catch (error) {
    context.el.classList.add("jp-RenderedText");
    context.el.textContent =
      "The live view's code did not load (the kernel that made this view may have " +
      `restarted: run the cell again): ${error?.message ?? error}`;
    return;
  }
  return live.default.render(context);
}

export default { initialize, render };
