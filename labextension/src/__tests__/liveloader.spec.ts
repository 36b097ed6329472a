/**
 * The live views' loader (jupyter_dist/widgets/live_loader.js, each view's anywidget
 * module): the code the kernel sends once (its LiveCode widget) loaded once per page and
 * handed to every view that names it.
 */
// eslint-disable-next-line @typescript-eslint/ban-ts-comment
// @ts-ignore: a plain JavaScript module without types
import loader, { liveCode } from '../../../jupyter_dist/widgets/live_loader.js';

/** A LiveCode model, as the widget manager gives it: its traits. */
function codeModel(code: string, style: string): any {
  const traits: { [name: string]: string } = { code, style };
  return { get: (name: string) => traits[name] };
}

/** A view's model: its `_code`, and the manager that finds the LiveCode it names. */
function viewModel(codeId: string, models: { [id: string]: any }, asked: string[]): any {
  return {
    get: (name: string) => (name === '_code' ? codeId : undefined),
    widget_manager: {
      get_model: async (id: string) => {
        asked.push(id);
        if (!(id in models)) {
          throw new Error(`widget model not found: ${id}`);
        }
        return models[id];
      }
    }
  };
}

describe('liveCode', () => {
  it('loads each LiveCode once, for every view that names it, and adds its style once', async () => {
    const models = { k1: codeModel('export const n = 1;', '.a { color: red; }') };
    const asked: string[] = [];
    const loaded: string[] = [];
    const load = async (source: string) => {
      loaded.push(source);
      return { default: {}, source };
    };
    const first = await liveCode(viewModel('k1', models, asked), load);
    const second = await liveCode(viewModel('k1', models, asked), load);
    expect(first).toBe(second);
    expect(loaded).toEqual(['export const n = 1;']);
    expect(asked).toEqual(['k1']);
    const styles = document.querySelectorAll('style#jupyter-dist-live-css');
    expect(styles).toHaveLength(1);
    expect(styles[0].textContent).toBe('.a { color: red; }');
  });

  it("loads another kernel's code of its own", async () => {
    const models = { k2: codeModel('export const n = 2;', '.b {}') };
    const loaded: string[] = [];
    const load = async (source: string) => {
      loaded.push(source);
      return { default: {} };
    };
    await liveCode(viewModel('k2', models, []), load);
    expect(loaded).toEqual(['export const n = 2;']);
    expect(document.querySelectorAll('style#jupyter-dist-live-css')).toHaveLength(1);
  });

  it('asks again after a LiveCode that could not be found', async () => {
    const models: { [id: string]: any } = {};
    const asked: string[] = [];
    const load = async () => ({ default: {} });
    await expect(liveCode(viewModel('k3', models, asked), load)).rejects.toThrow('not found');
    models.k3 = codeModel('', '');
    await expect(liveCode(viewModel('k3', models, asked), load)).resolves.toBeTruthy();
    expect(asked).toEqual(['k3', 'k3']);
  });
});

describe('the loader as a view module', () => {
  it("hands initialize and render to the loaded code's, with the view's context", async () => {
    const calls: string[] = [];
    const code = {
      default: {
        initialize: ({ model }: any) => calls.push(`initialize ${model.get('_code')}`),
        render: ({ model, el }: any) => {
          calls.push(`render ${model.get('_code')}`);
          el.textContent = 'drawn';
          return () => calls.push('cleaned up');
        }
      }
    };
    const models = { k4: codeModel('', '') };
    const model = viewModel('k4', models, []);
    await liveCode(model, async () => code);
    await loader.initialize({ model });
    const el = document.createElement('div');
    const cleanup = await loader.render({ model, el });
    expect(el.textContent).toBe('drawn');
    cleanup();
    expect(calls).toEqual(['initialize k4', 'render k4', 'cleaned up']);
  });

  it('says in the view when the code cannot be found (its kernel restarted)', async () => {
    const model = viewModel('gone', {}, []);
    await loader.initialize({ model });
    const el = document.createElement('div');
    await loader.render({ model, el });
    expect(el.textContent).toContain("The live view's code did not load");
    expect(el.textContent).toContain('widget model not found: gone');
  });
});
