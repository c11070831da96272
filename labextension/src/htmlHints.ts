/**
 * Resource hints out of HTML files shown in JupyterLab's HTML viewer.
 *
 * A sandbox writes files into its workspace, and a private session may write
 * its data into an HTML file as the host name of a `<link rel="preconnect">`
 * or `<link rel="dns-prefetch">`. The Lab's Content-Security-Policy stops
 * every fetch from the viewer's frame, but Chromium resolves and connects
 * for those hints whatever the policy says: the name (one DNS query) carries
 * the data out. The hints only make pages load sooner, so the viewer gets the
 * document without them; nothing else in it changes. That includes the
 * documents a page holds, which the frame builds with no other check: a
 * `srcdoc` frame's, a template's that becomes a shadow tree, a `data:` URL
 * frame's (each reached the network while only the page itself was cleaned).
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

/**
 * Documents inside documents (`srcdoc` frames, templates) looked into; one
 * nested deeper is treated as holding hints.
 */
const MAX_DEPTH = 8;

const GIVEN_UP =
  '<body><p>sandbox_kernel: this HTML file was not shown: its resource ' +
  'hints could not be removed. Open it with the Editor to read it.</p></body>';

/** A change that takes one hint out of a document. */
type Removal = () => void;

function isHint(link: Element): boolean {
  const rels = (link.getAttribute('rel') ?? '').toLowerCase().split(/\s+/);
  return rels.some(rel => HINT_RELS.has(rel));
}

function isDataUrl(value: string, base: string): boolean {
  try {
    // the browser's own URL parser: it drops the tabs, newlines and
    // surrounding spaces a hand-written check would miss
    return new URL(value, base).protocol === 'data:';
  } catch {
    return false;
  }
}

/**
 * Every hint under `root`, as the frame would see it: links and speculation
 * rules, and what is inside the documents a frame builds from the page
 * without another check. A `srcdoc` frame's document is parsed from its
 * attribute (the attribute goes when that document holds a hint); a
 * template's content becomes a shadow tree (`shadowrootmode`); a `data:` URL
 * frame is a document from the page's text (its `src` goes: the Lab's policy
 * refuses such frames too).
 */
function hints(
  root: ParentNode,
  parser: DOMParser,
  base: string,
  depth = 0
): Removal[] {
  const found: Removal[] = [];
  for (const link of Array.from(root.querySelectorAll('link'))) {
    if (isHint(link)) {
      found.push(() => link.remove());
    }
  }
  for (const script of Array.from(root.querySelectorAll('script'))) {
    // speculation rules prefetch and prerender pages named in JSON
    const type = (script.getAttribute('type') ?? '').trim().toLowerCase();
    if (type === 'speculationrules') {
      found.push(() => script.remove());
    }
  }
  for (const template of Array.from(root.querySelectorAll('template'))) {
    if (depth >= MAX_DEPTH) {
      found.push(() => template.remove());
    } else {
      found.push(...hints(template.content, parser, base, depth + 1));
    }
  }
  for (const frame of Array.from(root.querySelectorAll('[srcdoc]'))) {
    const inner = parser.parseFromString(
      frame.getAttribute('srcdoc') ?? '',
      'text/html'
    );
    if (
      depth >= MAX_DEPTH ||
      hints(inner, parser, base, depth + 1).length > 0
    ) {
      found.push(() => frame.removeAttribute('srcdoc'));
    }
  }
  for (const frame of Array.from(root.querySelectorAll('iframe, frame'))) {
    const src = frame.getAttribute('src');
    if (src !== null && isDataUrl(src, base)) {
      found.push(() => frame.removeAttribute('src'));
    }
  }
  return found;
}

/**
 * `html` (as the viewer serialises a document: the inside of `<html>`)
 * without resource hints, in it or in the documents it holds. Unchanged when
 * it has none. Parsed again after each removal until nothing is found, so
 * what the frame parses is what was checked; a document that keeps growing
 * hints is replaced by a notice.
 */
export function withoutResourceHints(html: string): string {
  const parser = new DOMParser();
  const base = document.baseURI;
  let text = html;
  for (let pass = 0; pass < MAX_PASSES; pass++) {
    const doc = parser.parseFromString(text, 'text/html');
    const found = hints(doc, parser, base);
    if (found.length === 0) {
      return text;
    }
    for (const remove of found) {
      remove();
    }
    text = doc.documentElement.innerHTML;
  }
  const doc = parser.parseFromString(text, 'text/html');
  return hints(doc, parser, base).length === 0 ? text : GIVEN_UP;
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
