/**
 * sandbox-kernel-status: shows whether a notebook's sandbox has network, and
 * that a notebook is NOT sandboxed when it runs another kernel (with a
 * one-click switch to the sandboxed kernel).
 *
 * JupyterLab: a status-bar item that follows the active notebook.
 * Notebook 7 (no status bar), or JupyterLab with the status bar disabled: the
 * same item in each notebook's toolbar, before the kernel name.
 *
 * More plugins guard what the browser does with what a sandbox wrote:
 * `htmlHints` (resource hints out of the HTML viewer), `savedWidgetState`
 * (no saved widget state of untrusted notebooks is built), `vegaCharts`, and
 * `outputScripts` (no JavaScript output is run while the server's script
 * policy is on).
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { INotebookShell } from '@jupyter-notebook/application';

import { ILevelRaised, StatusClient } from './client';
import { htmlHintsPlugin } from './htmlHints';
import { outputScriptsPlugin } from './outputScripts';
import { savedWidgetStatePlugin } from './savedWidgetState';
import { vegaChartsPlugin } from './vegaCharts';
import { levelRank } from './protocol';
import { StatusItem, riseMessage, showStatusDialog } from './widgets';

export { StatusClient, isSandboxKernelName } from './client';
export * from './protocol';
export { HINT_RELS, withoutResourceHints } from './htmlHints';
export {
  OUTPUT_SCRIPTS_OPTION,
  outputScriptsOff,
  withoutOutputScripts
} from './outputScripts';
export { guardSavedWidgetState, isTrustedNotebook } from './savedWidgetState';
export {
  guardVegaFactory,
  guardVegaRenderers,
  isVegaMimeType,
  safeEmbedOptions,
  safeSpec
} from './vegaCharts';

const PLUGIN_ID = 'sandbox-kernel-status:plugin';
const TOOLBAR_ITEM = 'sandboxKernelStatus';

/** Highest level already announced per kernel id (two views, one kernel). */
const announced = new Map<string, number>();

function announce(client: StatusClient, change: ILevelRaised): void {
  const kernelId = client.kernelId ?? client.sessionContext.path;
  const rank = levelRank(change.to);
  if ((announced.get(kernelId) ?? -1) >= rank) {
    return;
  }
  announced.set(kernelId, rank);
  const name = client.sessionContext.name || client.sessionContext.path;
  const where = name.length > 40 ? `${name.slice(0, 37)}…` : name;
  Notification.warning(riseMessage(change, where), {
    autoClose: false,
    actions: [
      {
        label: 'Details',
        caption: 'Show the sandbox status of this notebook',
        callback: () => {
          void showStatusDialog(client);
        }
      }
    ]
  });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'Shows whether the sandboxed kernel of a notebook has network, and lets the user mark the session private.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, INotebookShell],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    notebookShell: INotebookShell | null
  ): void => {
    const clients = new Map<NotebookPanel, StatusClient>();
    const useToolbar = !statusBar || !!notebookShell;

    const clientFor = (panel: NotebookPanel): StatusClient => {
      let client = clients.get(panel);
      if (!client) {
        const created = new StatusClient(panel.sessionContext);
        client = created;
        clients.set(panel, created);
        created.levelRaised.connect((_, change) => announce(created, change));
        panel.disposed.connect(() => {
          clients.delete(panel);
          created.dispose();
        });
        if (useToolbar) {
          addToolbarItem(panel, created);
        }
      }
      return client;
    };

    const openDialog = (client: StatusClient): void => {
      void showStatusDialog(client);
    };

    const addToolbarItem = (
      panel: NotebookPanel,
      client: StatusClient
    ): void => {
      const item = new StatusItem({
        client,
        hideWhenInactive: true,
        onActivate: openDialog
      });
      item.addClass('sk-status-toolbar-item');
      const toolbar = panel.toolbar;
      if (!toolbar.insertBefore('kernelName', TOOLBAR_ITEM, item)) {
        toolbar.addItem(TOOLBAR_ITEM, item);
      }
      panel.disposed.connect(() => item.dispose());
    };

    tracker.forEach(panel => clientFor(panel));
    tracker.widgetAdded.connect((_, panel) => {
      clientFor(panel);
    });

    if (!useToolbar && statusBar) {
      const item = new StatusItem({
        hideWhenInactive: false,
        onActivate: openDialog
      });
      item.addClass('sk-status-statusbar-item');
      const follow = (): void => {
        const panel = tracker.currentWidget;
        item.setClient(panel ? clientFor(panel) : null);
      };
      tracker.currentChanged.connect(follow);
      follow();
      statusBar.registerStatusItem(PLUGIN_ID, {
        item,
        align: 'left',
        rank: 5,
        isActive: () => item.isClientActive,
        activeStateChanged: item.activeStateChanged
      });
    }

    console.debug(
      `sandbox-kernel-status: active (${useToolbar ? 'notebook toolbar' : 'status bar'}; ${app.name})`
    );
  }
};

export default [
  plugin,
  htmlHintsPlugin,
  outputScriptsPlugin,
  savedWidgetStatePlugin,
  vegaChartsPlugin
];
