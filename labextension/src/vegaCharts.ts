/**
 * Vega and Vega-Lite charts drawn without running what a sandbox wrote.
 *
 * The kernel drops Vega output of sandboxed cells (it needs JavaScript), but
 * a sandbox writes files: JupyterLab draws Vega outputs of any notebook,
 * trusted or not (its renderer is "safe"), and `.vl.json`/`.vg.json` files,
 * with vega-embed. A sandbox then writes both the spec and vega-embed's
 * options (the output's metadata `embed_options`, and the spec's own
 * `usermeta.embedOptions`). Found attacking the edges:
 * - "View Source" and "View Compiled Vega" in a chart's menu write the spec,
 *   not escaped, and the `sourceHeader`/`sourceFooter` options into a new
 *   window of the Lab's origin: a `<script>` in a chart's title ran there,
 *   with the user's session (the server's API opens terminals on the host),
 *   after one natural click;
 * - "Open in Vega Editor" posts the spec, data included, to `editorUrl`, any
 *   site the options name;
 * - a string `defaultStyle` is CSS put into the head of the Lab's page, and
 *   `bind` moves the chart's inputs anywhere in it;
 * - Vega compiles a spec's expressions into JavaScript (`Function`) unless
 *   told to interpret them (`ast`), and its expression sandbox has had
 *   escapes (GHSA-4vq7-882g-wcg4, CVE-2025-25304).
 *
 * Every Vega renderer's charts therefore get options from an allow-list, with
 * `ast: true` (vega-embed's interpreter, made for pages that allow no eval)
 * and vega-embed's source, compiled and editor actions off. "View Source" and
 * "View Compiled Vega" come back as menu items of ours that put the JSON into
 * the new window as text. The renderer's factory object is changed in place:
 * the notebooks' registries are copies that share it.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import {
  PartialJSONObject,
  ReadonlyPartialJSONObject,
  ReadonlyPartialJSONValue
} from '@lumino/coreutils';

const VEGA_MIME = /^application\/vnd\.vega(?:lite)?\.v\d+\+json$/;

/** Whether `mimeType` is a Vega or Vega-Lite spec (any version). */
export function isVegaMimeType(mimeType: string): boolean {
  return VEGA_MIME.test(mimeType);
}

type Check = (value: unknown) => boolean;

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);
const isString: Check = value => typeof value === 'string';
const isNumber: Check = value =>
  typeof value === 'number' && Number.isFinite(value);
const isBoolean: Check = value => typeof value === 'boolean';
const objectOf =
  (check: Check): Check =>
  value =>
    isObject(value) && Object.values(value).every(check);
const either =
  (...checks: Check[]): Check =>
  value =>
    checks.some(check => check(value));

/**
 * vega-embed options a chart keeps, each with the type it must have: what
 * changes how it looks, nothing that names code, a URL, CSS, HTML or a place
 * in the page (`config` and `patch` as objects only: as strings they are
 * URLs to load).
 */
const KEPT: Record<string, Check> = {
  theme: isString,
  renderer: value => value === 'canvas' || value === 'svg',
  scaleFactor: either(isNumber, objectOf(isNumber)),
  width: isNumber,
  height: isNumber,
  padding: either(isNumber, objectOf(isNumber)),
  config: isObject,
  patch: Array.isArray,
  downloadFileName: isString,
  logLevel: isNumber,
  tooltip: isBoolean,
  hover: isBoolean,
  i18n: objectOf(isString),
  formatLocale: isObject,
  timeFormatLocale: isObject,
  forceActionsMenu: isBoolean,
  runAsync: isBoolean
};

/** The kept options of `options`, as they were (anything else is dropped). */
function allowed(options: unknown): PartialJSONObject {
  const kept: PartialJSONObject = {};
  if (!isObject(options)) {
    return kept;
  }
  for (const [key, check] of Object.entries(KEPT)) {
    if (key in options && check(options[key])) {
      kept[key] = options[key] as ReadonlyPartialJSONValue as never;
    }
  }
  return kept;
}

/**
 * The vega-embed options a chart is drawn with: the allowed ones of
 * `options`, expressions interpreted (`ast`), and of the actions only the
 * exports (and only if the options show actions at all).
 */
export function safeEmbedOptions(options: unknown): PartialJSONObject {
  const kept = allowed(options);
  const actions = isObject(options) ? options.actions : undefined;
  const exports =
    isObject(actions) && 'export' in actions ? actions.export : true;
  kept.actions =
    actions === false
      ? false
      : {
          export:
            isBoolean(exports) || objectOf(isBoolean)(exports)
              ? (exports as boolean)
              : true,
          source: false,
          compiled: false,
          editor: false
        };
  kept.ast = true;
  return kept;
}

/**
 * `spec` with its own embed options (`usermeta.embedOptions`, which vega-embed
 * merges over the caller's) cut to the allowed ones: never `actions` or `ast`.
 */
export function safeSpec(
  spec: ReadonlyPartialJSONValue | undefined
): ReadonlyPartialJSONValue | undefined {
  if (!isObject(spec) || !isObject(spec.usermeta)) {
    return spec;
  }
  const usermeta = spec.usermeta as Record<string, unknown>;
  if (!('embedOptions' in usermeta)) {
    return spec;
  }
  return {
    ...spec,
    usermeta: { ...usermeta, embedOptions: allowed(usermeta.embedOptions) }
  } as ReadonlyPartialJSONObject;
}

/** What the renderer is given: the same model with safe options and spec. */
function guardedModel(
  model: IRenderMime.IMimeModel,
  mimeType: string
): IRenderMime.IMimeModel {
  const metadata = model.metadata[mimeType];
  return {
    trusted: model.trusted,
    data: { ...model.data, [mimeType]: safeSpec(model.data[mimeType]) },
    metadata: {
      ...model.metadata,
      [mimeType]: {
        ...(isObject(metadata) ? (metadata as ReadonlyPartialJSONObject) : {}),
        embed_options: safeEmbedOptions(
          isObject(metadata) ? metadata.embed_options : undefined
        )
      }
    },
    // the renderer adds a PNG of the chart to the output: the spec saved
    // with it stays the one the file had
    setData: options =>
      model.setData({
        ...options,
        data: options.data
          ? { ...options.data, [mimeType]: model.data[mimeType] }
          : undefined
      })
  };
}

/** Show `value` as JSON text in a new window (a click's own). */
function showJson(value: unknown, title: string): void {
  const opened = window.open('');
  if (opened === null) {
    return;
  }
  const doc = opened.document;
  doc.title = title;
  const pre = doc.createElement('pre');
  pre.textContent = JSON.stringify(value, null, 2);
  doc.body.appendChild(pre);
}

const SOURCE_CLASS = 'sk-vega-source';

/** vega-embed's labels, or the chart's own (i18n, text only). */
function label(options: PartialJSONObject, key: string, fallback: string) {
  const i18n = options.i18n;
  const own = isObject(i18n) ? i18n[key] : undefined;
  return typeof own === 'string' ? own : fallback;
}

/** Our "View Source" (and "View Compiled Vega") in the chart's menu. */
function addSourceActions(
  renderer: IRenderMime.IRenderer,
  spec: ReadonlyPartialJSONValue | undefined,
  mimeType: string,
  options: PartialJSONObject
): void {
  const menu = renderer.node.querySelector('.vega-actions');
  if (menu === null || menu.querySelector(`.${SOURCE_CLASS}`) !== null) {
    return;
  }
  const lite = mimeType.startsWith('application/vnd.vegalite.');
  const items: [string, string, () => unknown][] = [
    [
      label(options, 'SOURCE_ACTION', 'View Source'),
      `${lite ? 'Vega-Lite' : 'Vega'} JSON Source`,
      () => spec
    ]
  ];
  // the spec vega-embed compiled, kept by JupyterLab's renderer (if it still does)
  const result = (renderer as unknown as { _result?: { vgSpec?: unknown } })
    ._result;
  if (lite && result?.vgSpec !== undefined) {
    items.push([
      label(options, 'COMPILED_ACTION', 'View Compiled Vega'),
      'Vega JSON Source',
      () => result.vgSpec
    ]);
  }
  for (const [text, title, value] of items) {
    const link = document.createElement('a');
    link.href = '#';
    link.textContent = text;
    link.classList.add(SOURCE_CLASS);
    link.addEventListener('click', event => {
      event.preventDefault();
      showJson(value(), title);
    });
    menu.appendChild(link);
  }
}

const guarded = new WeakSet<IRenderMime.IRendererFactory>();

const NOT_DRAWN =
  'sandbox_kernel: this Vega chart names its spec by URL, and is not drawn: ' +
  'open the spec file itself.';

/** Make `factory`'s renderers draw safe charts (in place, once). */
export function guardVegaFactory(
  factory: IRenderMime.IRendererFactory
): IRenderMime.IRendererFactory {
  if (guarded.has(factory)) {
    return factory;
  }
  const create = factory.createRenderer.bind(factory);
  factory.createRenderer = options => {
    const renderer = create(options);
    const { mimeType } = options;
    if (!isVegaMimeType(mimeType)) {
      return renderer;
    }
    const render = renderer.renderModel.bind(renderer);
    renderer.renderModel = async model => {
      const spec = model.data[mimeType];
      if (spec !== undefined && !isObject(spec)) {
        // a spec given as a URL is loaded by vega-embed, and its own options
        // (usermeta) with it, out of this plugin's sight
        renderer.node.textContent = NOT_DRAWN;
        return;
      }
      const safe = guardedModel(model, mimeType);
      await render(safe);
      const drawn = safe.metadata[mimeType] as ReadonlyPartialJSONObject;
      const used = drawn.embed_options as PartialJSONObject;
      if (used.actions !== false) {
        addSourceActions(renderer, model.data[mimeType], mimeType, used);
      }
    };
    return renderer;
  };
  guarded.add(factory);
  return factory;
}

/** Guard the Vega factories `registry` has, and those added to it later. */
export function guardVegaRenderers(registry: IRenderMimeRegistry): void {
  for (const mimeType of registry.mimeTypes) {
    const factory = isVegaMimeType(mimeType)
      ? registry.getFactory(mimeType)
      : undefined;
    if (factory !== undefined) {
      guardVegaFactory(factory);
    }
  }
  const add = registry.addFactory.bind(registry);
  registry.addFactory = (factory, rank) =>
    add(
      factory.mimeTypes.some(isVegaMimeType)
        ? guardVegaFactory(factory)
        : factory,
      rank
    );
}

export const vegaChartsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'sandbox-kernel-status:vega-charts',
  description:
    'Draws Vega and Vega-Lite charts (outputs of any notebook, .vl.json files) with allowed embed options only, interpreted expressions, and a View Source that shows the spec as text.',
  autoStart: true,
  requires: [IRenderMimeRegistry],
  activate: (app: JupyterFrontEnd, registry: IRenderMimeRegistry) => {
    guardVegaRenderers(registry);
  }
};
