/**
 * JavaScript outputs are not run while the Lab's script policy is on.
 *
 * The server's Content-Security-Policy (sandbox_kernel/lab_content_policy.py)
 * lets no inline script, event handler or `javascript:` address run in the
 * page, so a script that a sanitiser let through an output does not run. One
 * renderer runs an output's text by itself: Lab's JavaScript renderer
 * (`@jupyterlab/javascript-extension`) calls `eval` on an
 * `application/javascript` output shown as trusted, and the policy must allow
 * `eval` (Lab compiles its settings' schemas at run time). The server says
 * the policy is on through the page config option below (its page-config
 * hook sets it); this plugin then puts a renderer that shows a note in that
 * renderer's place, in JupyterLab and Notebook 7 alike (Notebook 7 loads
 * Lab's own renderers whatever `disabledExtensions` says).
 *
 * The HTML viewer's "Trust HTML" lets a file's scripts run in its frame, but
 * the frame's `blob:` document inherits the page's policy: its inline scripts
 * stay refused. The user who trusts a file is told so, once per viewer,
 * rather than left with a page that silently does nothing.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { HTMLViewer, IHTMLViewerTracker } from '@jupyterlab/htmlviewer';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

/** The page config option the server sets to `off` while its policy is on. */
export const OUTPUT_SCRIPTS_OPTION = 'sandboxKernelOutputScripts';

/** The MIME types Lab's JavaScript renderer runs. */
export const SCRIPT_MIME_TYPES: readonly string[] = [
  'application/javascript',
  'text/javascript'
];

export const NOT_RUN =
  'sandbox_kernel: this JavaScript output was not run (the Lab runs no ' +
  'script from an output; SANDBOX_KERNEL_REMOTE_CONTENT=1 on the server ' +
  'turns that off).';

/** Shows that a JavaScript output was not run, and runs nothing. */
class NotRunRenderer extends Widget implements IRenderMime.IRenderer {
  constructor() {
    super();
    this.addClass('sk-output-script-not-run');
  }

  async renderModel(): Promise<void> {
    this.node.textContent = NOT_RUN;
  }
}

/** Stands in for Lab's JavaScript renderer (same MIME types, same rank). */
export const notRunFactory: IRenderMime.IRendererFactory = {
  safe: false,
  mimeTypes: [...SCRIPT_MIME_TYPES],
  defaultRank: 0,
  createRenderer: () => new NotRunRenderer()
};

/**
 * Whether the server's page config says output scripts are off. Read from
 * the page's config element, as PageConfig does (one dependency fewer).
 */
export function outputScriptsOff(doc: Document = document): boolean {
  const element = doc.getElementById('jupyter-config-data');
  try {
    const config = JSON.parse(element?.textContent || '{}');
    return config[OUTPUT_SCRIPTS_OPTION] === 'off';
  } catch {
    return false;
  }
}

/**
 * Put {@link notRunFactory} in the place of `registry`'s JavaScript
 * renderer, and of any added later (registries cloned afterwards, one per
 * notebook, copy it).
 */
export function withoutOutputScripts(registry: IRenderMimeRegistry): void {
  registry.addFactory(notRunFactory, notRunFactory.defaultRank);
  const add = registry.addFactory.bind(registry);
  registry.addFactory = (factory, rank) => {
    add(factory, rank);
    if (
      factory !== notRunFactory &&
      factory.mimeTypes.some(type => SCRIPT_MIME_TYPES.includes(type))
    ) {
      add(notRunFactory, notRunFactory.defaultRank);
    }
  };
}

export const TRUSTED_HTML_NOT_RUN =
  "sandbox_kernel: this file's scripts do not run, trusted or not: the Lab " +
  'runs no script a sandbox could have written (SANDBOX_KERNEL_REMOTE_CONTENT=1 ' +
  'on the server turns that off).';

/** Tell the user who trusts `viewer`'s HTML that its scripts stay refused. */
export function noteTrustedHtml(viewer: HTMLViewer): void {
  let told = false;
  viewer.trustedChanged.connect((_, trusted) => {
    if (trusted && !told) {
      told = true;
      Notification.warning(TRUSTED_HTML_NOT_RUN, { autoClose: 10000 });
    }
  });
}

export const outputScriptsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'sandbox-kernel-status:output-scripts',
  description:
    "Shows a note instead of running JavaScript outputs while the server's script policy is on, and says that trusted HTML files run no script either.",
  autoStart: true,
  requires: [IRenderMimeRegistry],
  optional: [IHTMLViewerTracker],
  activate: (
    app: JupyterFrontEnd,
    registry: IRenderMimeRegistry,
    viewers: IHTMLViewerTracker | null
  ) => {
    if (!outputScriptsOff()) {
      return;
    }
    withoutOutputScripts(registry);
    viewers?.widgetAdded.connect((_, viewer) => noteTrustedHtml(viewer));
  }
};
