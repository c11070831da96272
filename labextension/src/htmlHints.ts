/**
 * Resource hints out of HTML files shown in JupyterLab's HTML viewer.
 *
 * A sandbox writes files into its workspace, and a private session may write
 * its data into an HTML file as the host name of a `<link rel="preconnect">`
 * or `<link rel="dns-prefetch">`. The Lab's Content-Security-Policy stops
 * every fetch from the viewer's frame, but Chromium resolves and connects
 * for those hints whatever the policy says: the name (one DNS query) carries
 * the data out. The hints only make pages load sooner, so the viewer gets the
 * document without them; nothing else in it changes.
 *
 * The viewer has no hook for this: the one step every document passes
 * through, `HTMLViewer._setupDocument` (parse, add `<base>`, serialise), is
 * wrapped. Its result, the exact text the frame loads, is what is checked.
 * Should a JupyterLab release drop that step, the viewer cannot be made safe
 * here, and each viewer opened is closed with a message instead.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { HTMLViewer, IHTMLViewerTracker } from '@jupyterlab/htmlviewer';

/** `rel` values that make a browser resolve, connect or fetch ahead of use. */
export const HINT_RELS: ReadonlySet<string> = new Set([
  'dns-prefetch',
  'preconnect',
  'prefetch',
  'preload',
  'modulepreload',
  'prerender'
]);

/** Rounds of removal before a document is given up as unstable. */
const MAX_PASSES = 3;

const GIVEN_UP =
  '<body><p>sandbox_kernel: this HTML file was not shown: its resource ' +
  'hints could not be removed. Open it with the Editor to read it.</p></body>';

function hints(doc: Document): Element[] {
  const found: Element[] = [];
  for (const link of Array.from(doc.querySelectorAll('link'))) {
    const rels = (link.getAttribute('rel') ?? '').toLowerCase().split(/\s+/);
    if (rels.some(rel => HINT_RELS.has(rel))) {
      found.push(link);
    }
  }
  for (const script of Array.from(doc.querySelectorAll('script'))) {
    // speculation rules prefetch and prerender pages named in JSON
    const type = (script.getAttribute('type') ?? '').trim().toLowerCase();
    if (type === 'speculationrules') {
      found.push(script);
    }
  }
  return found;
}

/**
 * `html` (as the viewer serialises a document: the inside of `<html>`)
 * without resource hints. Unchanged when it has none. Parsed again after each
 * removal until nothing is found, so what the frame parses is what was
 * checked; a document that keeps growing hints is replaced by a notice.
 */
export function withoutResourceHints(html: string): string {
  const parser = new DOMParser();
  let text = html;
  for (let pass = 0; pass < MAX_PASSES; pass++) {
    const doc = parser.parseFromString(text, 'text/html');
    const found = hints(doc);
    if (found.length === 0) {
      return text;
    }
    for (const element of found) {
      element.remove();
    }
    text = doc.documentElement.innerHTML;
  }
  const doc = parser.parseFromString(text, 'text/html');
  return hints(doc).length === 0 ? text : GIVEN_UP;
}

type SetupDocument = (this: HTMLViewer, data: string) => Promise<string>;

/** Wrap the viewer's document step; false when this JupyterLab has none. */
function wrapSetupDocument(): boolean {
  const proto = HTMLViewer.prototype as unknown as Record<string, unknown>;
  const original = proto['_setupDocument'];
  if (typeof original !== 'function') {
    return false;
  }
  if ((original as { sandboxKernelWrapped?: boolean }).sandboxKernelWrapped) {
    return true;
  }
  const setup = original as SetupDocument;
  const wrapped: SetupDocument = async function (this: HTMLViewer, data) {
    return withoutResourceHints(await setup.call(this, data));
  };
  (wrapped as { sandboxKernelWrapped?: boolean }).sandboxKernelWrapped = true;
  proto['_setupDocument'] = wrapped;
  return true;
}

export const htmlHintsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'sandbox-kernel-status:html-viewer-hints',
  description:
    'Removes resource hints (preconnect, dns-prefetch...) from HTML files shown in the HTML viewer: they reach the network whatever the page policy says.',
  autoStart: true,
  optional: [IHTMLViewerTracker],
  activate: (app: JupyterFrontEnd, tracker: IHTMLViewerTracker | null) => {
    if (wrapSetupDocument() || tracker === null) {
      return;
    }
    console.error(
      'sandbox_kernel: this JupyterLab has no HTMLViewer._setupDocument; HTML files are not shown in the viewer'
    );
    tracker.widgetAdded.connect((_, viewer) => {
      viewer.dispose();
      Notification.error(
        'sandbox_kernel: HTML files cannot be shown safely in this JupyterLab version (resource hints in them would reach the network). Open the file with the Editor.',
        { autoClose: false }
      );
    });
  }
};
