/**
 * Saved widget state of untrusted notebooks stays unread.
 *
 * A notebook keeps its widgets' state in its metadata, and the widget manager
 * (jupyterlab_widgets) builds every model in it as soon as the notebook is
 * opened, trusted or not. Building a model runs the code of its package, and
 * some packages run code the state carries: anywidget runs the `_esm` module's
 * `initialize` then. A sandbox can write such a notebook into its workspace
 * (any cell can), and opening it would run the sandbox's script in the Lab's
 * page, with the Jupyter server's API (terminals on the host) in reach.
 *
 * Jupyter's rule is that an untrusted notebook runs no script when opened,
 * and views of its widget outputs are not rendered anyway (their renderer is
 * not "safe"); so for an untrusted notebook the manager is given no saved
 * state. A signed notebook keeps it. The server signs any notebook whose cells
 * show no rich output at a save, without looking at its metadata, so the
 * server extension (sandbox_kernel.lab_signatures) keeps saves from signing a
 * notebook with saved widget state: `sandbox-kernel trust NOTEBOOK` on the host does.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { INotebookModel, NotebookPanel } from '@jupyterlab/notebook';

/** The metadata key widget managers read saved state from. */
export const WIDGETS_KEY = 'widgets';

/** Where the guarded server serves an untrusted notebook's saved state
 * (sandbox_kernel.lab_signatures.withhold_untrusted_widget_state): judged by
 * the signature it checked, not by the live cells, which Lab may add to. */
export const WITHHELD_KEY = 'sandbox_kernel_withheld_widgets';

const GUARDED = Symbol('sandboxKernelSavedWidgetStateGuard');

/** Whether the notebook was trusted when loaded: every code cell trusted, and
 * at least one (the server marks cells only after checking the signature). */
export function isTrustedNotebook(model: INotebookModel): boolean {
  let code = 0;
  for (let index = 0; index < model.cells.length; index++) {
    const cell = model.cells.get(index);
    if (cell.type !== 'code') {
      continue;
    }
    code++;
    if (!cell.trusted) {
      return false;
    }
  }
  return code > 0;
}

/**
 * Make `model.getMetadata('widgets')` answer nothing while the notebook is
 * untrusted. The metadata itself is not changed: the file keeps it, and a
 * save writes it back as it was.
 */
export function guardSavedWidgetState(model: INotebookModel): void {
  const marked = model as unknown as Record<symbol, boolean>;
  if (marked[GUARDED]) {
    return;
  }
  marked[GUARDED] = true;
  const original = model.getMetadata.bind(model);
  let said = false;
  const warn = () => {
    if (!said) {
      said = true;
      console.warn(
        'sandbox_kernel: the saved widget state of this untrusted notebook is not loaded (building its models could run code it carries); if you wrote it, sign it on the host (sandbox-kernel trust NOTEBOOK) and open it again to load it'
      );
    }
  };
  model.getMetadata = (key: string) => {
    const value = original(key);
    if (key !== WIDGETS_KEY) {
      return value;
    }
    if (value === undefined) {
      if (original(WITHHELD_KEY) !== undefined) {
        warn(); // the server withheld it
      }
      return value;
    }
    if (isTrustedNotebook(model)) {
      return value;
    }
    warn();
    return undefined;
  };
}

class SavedWidgetStateGuard implements DocumentRegistry.IWidgetExtension<
  NotebookPanel,
  INotebookModel
> {
  createNew(
    panel: NotebookPanel,
    context: DocumentRegistry.IContext<INotebookModel>
  ): void {
    // At the panel's creation, before the model is loaded: every widget
    // manager reads the state later (after the session is ready).
    guardSavedWidgetState(context.model);
  }
}

export const savedWidgetStatePlugin: JupyterFrontEndPlugin<void> = {
  id: 'sandbox-kernel-status:saved-widget-state',
  description:
    'Keeps the saved widget state of untrusted notebooks from being loaded: building widget models can run code the state carries.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.docRegistry.addWidgetExtension('Notebook', new SavedWidgetStateGuard());
  }
};
