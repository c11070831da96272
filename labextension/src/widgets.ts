/**
 * The status item (status bar or notebook toolbar), the details popup and the
 * "Mark session private…" dialog.
 *
 * Everything shown comes from the kernel, and dataset names and warnings may
 * come from untrusted cell code: text only (textContent), never HTML.
 *
 * Stable DOM hooks (kept for browser tests, see docs/comm.md):
 *   .sk-status-item[data-network][data-level][data-phase]  the item
 *   .sk-status-item .sk-status-label                        its text
 *   .sk-status-item[data-phase=unsandboxed]                 a kernel that is NOT sandboxed
 *   .sk-status-item[data-enforces-network=false]            a sandbox kernel on a backend that
 *                                                           cuts no network (subprocess fallback)
 *   .sk-status-egress-entry[data-count]                     how many connections an egress entry
 *                                                           stands for (shown as ×N when > 1)
 *   button.sk-switch-kernel                                 "Switch to the sandboxed kernel"
 *                                                           (in the item and in its popup)
 *   .sk-status-links-disabled                               popup: links disabled once private
 *   .sk-status-no-page-policy                               popup: once private, on a server without
 *                                                           the page policy (files can still fetch)
 *   .sk-status-dialog                                       the details popup
 *   button.sk-mark-private                                  its "Mark session private…"
 *   .sk-mark-private-dialog, select.sk-mark-private-level,
 *   input.sk-mark-private-reason, button.sk-mark-private-confirm
 */
import { Dialog, showErrorMessage } from '@jupyterlab/apputils';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import {
  type ILevelRaised,
  SANDBOX_KERNEL_NAME,
  type StatusClient
} from './client';
import { outputScriptsOff } from './outputScripts';
import { IState, Level, MARKABLE_LEVELS, levelRank } from './protocol';

/** The item's text on a notebook whose kernel is not sandbox_kernel. */
export const NOT_SANDBOXED_LABEL = 'Not sandboxed';
export const SWITCH_LABEL = 'Switch to the sandboxed kernel';

function unsandboxedExplanation(client: StatusClient): string {
  const kernel = client.kernelDisplayName || 'this kernel';
  return (
    `This notebook runs on "${kernel}", which is not sandboxed: its cells run ` +
    'directly on this computer, with your files, your credentials and the network. ' +
    `Switch to the sandboxed kernel (${SANDBOX_KERNEL_NAME}) before running code you ` +
    'did not write. Variables of the current kernel are not carried over.'
  );
}

/**
 * Change the notebook's kernel to the sandboxed one; an error (the sandboxed
 * kernelspec is missing, the server refused) is shown, not swallowed.
 */
export async function switchToSandbox(client: StatusClient): Promise<void> {
  try {
    await client.switchToSandbox();
  } catch (err) {
    await showErrorMessage(
      'Could not switch to the sandboxed kernel',
      err instanceof Error ? err.message : String(err)
    );
  }
}

/**
 * The popup's text for a rise. On a backend that does not enforce network
 * (the development subprocess fallback) nothing was cut: the kernel refuses
 * every later cell instead, and the popup says exactly that. JupyterLab's
 * toast shows the first 140 characters: what matters comes first.
 */
export function riseMessage(change: ILevelRaised, where: string): string {
  if (change.state.enforces_network) {
    return (
      `Network cut: private data (${change.to}) entered this session (${where}). ` +
      'Its sandbox has no network from now on.'
    );
  }
  return (
    'Network NOT cut: this kernel is NOT sandboxed and runs no more code. ' +
    `Private data (${change.to}) entered this session (${where}).`
  );
}

/**
 * The item's text on a backend that does not enforce network (the subprocess
 * fallback): its network is the host's while public, and once private it is
 * NOT cut; the kernel refuses every cell instead. Never "Network off" there.
 */
function unenforcedLabel(state: IState): string {
  return state.private
    ? `${NOT_SANDBOXED_LABEL} · cells refused · ${state.level}`
    : `${NOT_SANDBOXED_LABEL} · Network on`;
}

/** The one-line text of the item for a client. */
export function itemLabel(client: StatusClient | null): string {
  if (!client || !client.isActive) {
    return '';
  }
  if (client.isUnsandboxed) {
    return NOT_SANDBOXED_LABEL;
  }
  const state = client.state;
  if (client.phase === 'unavailable' && !state) {
    return 'Sandbox status unavailable';
  }
  if (!state) {
    return 'Sandbox: connecting…';
  }
  if (!state.enforces_network) {
    return unenforcedLabel(state);
  }
  if (state.network === 'full') {
    return 'Network on';
  }
  if (state.network === 'proxied') {
    const n = state.egress?.domains.length ?? 0;
    return `Network: proxied · ${n} ${n === 1 ? 'domain' : 'domains'}`;
  }
  return state.private ? `Network off · ${state.level}` : 'Network off';
}

function itemTitle(client: StatusClient | null): string {
  if (client?.isUnsandboxed) {
    return `${unsandboxedExplanation(client)}\nClick for details.`;
  }
  const state = client?.state;
  if (!client || !state) {
    return client?.lastError ?? 'Sandboxed kernel: waiting for its status';
  }
  const lines = [
    !state.enforces_network
      ? state.private
        ? `Not sandboxed (${state.backend} backend): private data (${state.level}) entered this session ` +
          'and its network was NOT cut, so this kernel runs no more code in it.'
        : `Not sandboxed (${state.backend} backend): cells run as plain processes on this computer, ` +
          'with your files and the network.'
      : state.network === 'full'
        ? `Sandbox (${state.backend}): the notebook's code can reach the network.`
        : state.network === 'proxied'
          ? `Sandbox (${state.backend}): web traffic only, through the egress proxy (rules and a log).`
          : state.private
            ? `Sandbox (${state.backend}): private data (${state.level}) entered this session; no network, for good.`
            : `Sandbox (${state.backend}): no network.`
  ];
  if (state.error) {
    lines.push(`Error: ${state.error}`);
  }
  for (const w of state.warnings) {
    lines.push(`Warning: ${w}`);
  }
  lines.push('Click for details.');
  return lines.join('\n');
}

function formatTime(value: string): string {
  const date = new Date(value);
  return isNaN(date.getTime()) ? value : date.toLocaleString();
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/**
 * The status item. Shows the state of one StatusClient; `setClient` swaps the
 * client (the status bar follows the active notebook).
 */
export class StatusItem extends Widget {
  constructor(options: StatusItem.IOptions) {
    super({ node: document.createElement('div') });
    this._hideWhenInactive = options.hideWhenInactive;
    this._onActivate = options.onActivate;
    this.addClass('sk-status-item');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this._icon = el('span', 'sk-status-icon');
    this._label = el('span', 'sk-status-label');
    this._flag = el('span', 'sk-status-flag');
    // A real button, so that the switch is one click from the item (the rest
    // of the item opens the popup that explains why).
    this._switch = el(
      'button',
      'sk-switch-kernel jp-mod-styled jp-mod-warn',
      'Switch to sandboxed'
    );
    this._switch.type = 'button';
    this._switch.title = SWITCH_LABEL;
    this._switch.setAttribute('aria-label', SWITCH_LABEL);
    this._switch.addEventListener('click', this._onSwitch);
    this.node.append(this._icon, this._label, this._flag, this._switch);
    this.node.addEventListener('click', this._onClick);
    this.node.addEventListener('keydown', this._onKey);
    this.setClient(options.client ?? null);
  }

  get client(): StatusClient | null {
    return this._client;
  }

  /** Emitted when whether the item should be shown may have changed. */
  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  /** Whether the item has something to show (a sandbox kernel). */
  get isClientActive(): boolean {
    return !!this._client && !this._client.isDisposed && this._client.isActive;
  }

  setClient(client: StatusClient | null): void {
    if (client === this._client) {
      return;
    }
    if (this._client) {
      this._client.changed.disconnect(this._update, this);
    }
    this._client = client;
    if (client) {
      client.changed.connect(this._update, this);
    }
    this._update();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.setClient(null);
    this.node.removeEventListener('click', this._onClick);
    this.node.removeEventListener('keydown', this._onKey);
    this._switch.removeEventListener('click', this._onSwitch);
    super.dispose();
  }

  private _update(): void {
    const client = this._client;
    const state = client?.state ?? null;
    const node = this.node;
    node.dataset.phase = client && client.isActive ? client.phase : 'inactive';
    node.dataset.network = state ? state.network : 'unknown';
    node.dataset.level = state ? state.level : '';
    node.dataset.backend = state ? state.backend : '';
    node.dataset.enforcesNetwork = state ? String(state.enforces_network) : '';
    this._label.textContent = itemLabel(client);
    const unsandboxed = !!client && client.isUnsandboxed;
    const problem =
      !!state && (state.error !== null || state.warnings.length > 0);
    this._flag.textContent = problem || unsandboxed ? '⚠' : '';
    this.toggleClass('sk-mod-unsandboxed', unsandboxed);
    this._switch.hidden = !unsandboxed;
    this._switch.disabled = this._switching;
    this.toggleClass('sk-mod-error', !!state?.error);
    this.toggleClass('sk-mod-warning', !!state && state.warnings.length > 0);
    const title = itemTitle(client);
    node.title = title;
    node.setAttribute('aria-label', title);
    if (this._hideWhenInactive) {
      this.setHidden(!this.isClientActive);
    }
    const active = this.isClientActive;
    if (active !== this._wasActive) {
      this._wasActive = active;
      this._activeStateChanged.emit();
    }
  }

  private _onClick = (event: MouseEvent): void => {
    event.preventDefault();
    if (this._client && this.isClientActive) {
      this._onActivate(this._client);
    }
  };

  private _onSwitch = (event: MouseEvent): void => {
    event.preventDefault();
    event.stopPropagation();
    const client = this._client;
    if (!client || !client.isUnsandboxed || this._switching) {
      return;
    }
    this._switching = true;
    this._update();
    void switchToSandbox(client).finally(() => {
      this._switching = false;
      if (!this.isDisposed) {
        this._update();
      }
    });
  };

  private _onKey = (event: KeyboardEvent): void => {
    if (event.target === this._switch) {
      return; // the button handles its own Enter / Space
    }
    if (event.key === 'Enter' || event.key === ' ') {
      event.preventDefault();
      if (this._client && this.isClientActive) {
        this._onActivate(this._client);
      }
    }
  };

  private _client: StatusClient | null = null;
  private _wasActive = false;
  private _hideWhenInactive: boolean;
  private _onActivate: (client: StatusClient) => void;
  private _icon: HTMLSpanElement;
  private _label: HTMLSpanElement;
  private _flag: HTMLSpanElement;
  private _switch: HTMLButtonElement;
  private _switching = false;
  private _activeStateChanged = new Signal<this, void>(this);
}

export namespace StatusItem {
  export interface IOptions {
    client?: StatusClient | null;
    /**
     * Hide the widget itself when inactive, i.e. without a kernel (toolbar);
     * the status bar hides it via isActive. Never hidden on an unsandboxed kernel.
     */
    hideWhenInactive: boolean;
    /** Called on click / Enter with the item's client. */
    onActivate: (client: StatusClient) => void;
  }
}

/** The details shown in the popup; re-renders while the popup is open. */
class StatusBody extends Widget {
  constructor(private _client: StatusClient) {
    super();
    this.addClass('sk-status-body');
    _client.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    if (!this.isDisposed) {
      this._client.changed.disconnect(this._render, this);
    }
    super.dispose();
  }

  private _render(): void {
    const client = this._client;
    const state = client.state;
    const node = this.node;
    node.textContent = '';
    const summary = el('p', 'sk-status-summary', itemLabel(client));
    node.appendChild(summary);
    if (client.isUnsandboxed) {
      node.dataset.network = 'unknown';
      node.appendChild(
        el('p', 'sk-status-unsandboxed', unsandboxedExplanation(client))
      );
      return;
    }
    if (!state) {
      node.appendChild(
        el(
          'p',
          'sk-status-pending',
          client.lastError ??
            'The kernel has not sent its status yet. It is asked again when it is idle.'
        )
      );
      return;
    }
    node.dataset.network = state.network;
    node.dataset.level = state.level;

    const facts = el('table', 'sk-status-facts');
    const row = (label: string, value: string, field: string): void => {
      const tr = el('tr');
      tr.append(el('th', undefined, label));
      const td = el('td', undefined, value);
      td.dataset.field = field;
      tr.append(td);
      facts.append(tr);
    };
    row('Level', state.level, 'level');
    row(
      'Network',
      !state.enforces_network
        ? state.private
          ? 'NOT cut (this kernel is not sandboxed): it runs no more code in this session'
          : 'on: not sandboxed, the code reaches the network and your files'
        : state.network === 'full'
          ? 'on: the code can reach the network'
          : state.network === 'proxied'
            ? 'proxied: HTTP(S) through the egress proxy, nothing else'
            : state.private
              ? 'off, for good (private data entered this session)'
              : 'off',
      'network'
    );
    row(
      'Sandbox',
      state.enforces_network
        ? state.backend
        : `${state.backend} (NOT sandboxed: cells run as plain processes)`,
      'backend'
    );
    row('Session', `${state.session_id} (user ${state.user_id})`, 'session');
    node.appendChild(facts);
    if (levelRank(state.level) > levelRank('PUBLIC')) {
      // The kernel removes external URLs from outputs once private (see the
      // README); say so, or a user would take dead links for a bug.
      node.appendChild(
        el(
          'p',
          'sk-status-links-disabled',
          'Links in outputs are disabled: private data is in this session, so outputs ' +
            'lose every external URL and the browser cannot send the data anywhere.'
        )
      );
      // Files the session wrote are the page policy's to keep inert (an
      // untrusted notebook's images, an HTML file's frames); a server without
      // it (its own config, SANDBOX_KERNEL_REMOTE_CONTENT=1) gets told.
      if (!outputScriptsOff()) {
        node.appendChild(
          el(
            'p',
            'sk-status-no-page-policy',
            "This Jupyter server does not apply sandbox_kernel's page policy: files this " +
              'session wrote (notebooks, HTML, markdown) can still make the browser fetch ' +
              'addresses when you open them here. Start Lab with scripts/lab.sh, or add ' +
              'lab_content_policy.apply(c) to jupyter_server_config.py (docs/security.md, ' +
              '"Files a sandbox wrote").'
          )
        );
      }
    }

    if (state.egress) {
      const egress = state.egress;
      node.appendChild(el('h3', undefined, 'Egress'));
      node.appendChild(
        el(
          'p',
          'sk-status-egress-summary',
          `${egress.allowed} allowed, ${egress.refused} refused` +
            (egress.domains.length ? ` · ${egress.domains.join(', ')}` : '') +
            (egress.cut ? ' · cut: the session is private' : '')
        )
      );
      if (egress.recent.length) {
        const table = el('table', 'sk-status-egress');
        for (const entry of egress.recent.slice().reverse()) {
          const tr = el('tr', 'sk-status-egress-entry');
          tr.dataset.allowed = String(entry.allowed);
          tr.dataset.count = String(entry.count);
          tr.append(
            el('td', undefined, entry.allowed ? 'allowed' : 'refused'),
            // identical refusals are one entry: say how many it stands for
            el(
              'td',
              'sk-status-egress-count',
              entry.count > 1 ? `×${entry.count}` : ''
            ),
            el('td', undefined, `${entry.host}:${entry.port}`),
            el('td', undefined, entry.rule)
          );
          table.append(tr);
        }
        node.appendChild(table);
      }
    }

    node.appendChild(el('h3', undefined, 'Private data'));
    if (state.datasets.length === 0) {
      node.appendChild(
        el('p', 'sk-status-no-datasets', 'None has entered this session.')
      );
    } else {
      const table = el('table', 'sk-status-datasets');
      const head = el('tr');
      for (const h of ['Name', 'Level', 'Source', 'Added']) {
        head.append(el('th', undefined, h));
      }
      table.append(el('thead'));
      table.tHead!.append(head);
      const body = el('tbody');
      for (const ds of state.datasets) {
        const tr = el('tr', 'sk-status-dataset');
        tr.append(
          el('td', undefined, ds.name),
          el('td', undefined, ds.level),
          el('td', undefined, ds.source),
          el('td', undefined, formatTime(ds.added_at))
        );
        body.append(tr);
      }
      table.append(body);
      node.appendChild(table);
    }

    if (state.warnings.length) {
      const box = el('div', 'sk-status-warnings');
      box.append(el('h3', undefined, 'Warnings'));
      const ul = el('ul');
      for (const w of state.warnings) {
        ul.append(el('li', undefined, w));
      }
      box.append(ul);
      node.appendChild(box);
    }
    if (state.error) {
      node.appendChild(el('p', 'sk-status-error', `Error: ${state.error}`));
    }
    if (client.lastError) {
      node.appendChild(
        el('p', 'sk-status-kernel-error', `Kernel said: ${client.lastError}`)
      );
    }
    if (client.lastNotice) {
      node.appendChild(el('p', 'sk-status-notice', client.lastNotice));
    }
  }
}

const MARK_ACTION = 'sk-mark-private';
const SWITCH_ACTION = 'sk-switch-kernel';

/** The popup of a notebook whose kernel is not sandboxed: why, and the switch. */
async function showUnsandboxedDialog(client: StatusClient): Promise<void> {
  const dialog = new Dialog<void>({
    title: 'Not sandboxed',
    body: new StatusBody(client),
    buttons: [
      Dialog.cancelButton({ label: 'Close' }),
      Dialog.warnButton({
        label: SWITCH_LABEL,
        className: 'sk-switch-kernel',
        caption: `Replace this notebook's kernel by ${SANDBOX_KERNEL_NAME}`,
        actions: [SWITCH_ACTION]
      })
    ],
    defaultButton: 1,
    hasClose: true
  });
  dialog.addClass('sk-status-dialog');
  dialog.addClass('sk-unsandboxed-dialog');
  const result = await dialog.launch();
  if (result.button.actions.includes(SWITCH_ACTION)) {
    await switchToSandbox(client);
  }
}

/** Open the details popup for a client; offers "Mark session private…". */
export async function showStatusDialog(client: StatusClient): Promise<void> {
  if (client.isUnsandboxed) {
    return showUnsandboxedDialog(client);
  }
  const state = client.state;
  const canMark = !!state && levelRank(state.level) < levelRank('SECRET');
  const enforced = !state || state.enforces_network;
  const buttons: Dialog.IButton[] = [Dialog.cancelButton({ label: 'Close' })];
  if (canMark) {
    buttons.push(
      Dialog.warnButton({
        label: 'Mark session private…',
        className: 'sk-mark-private',
        caption: enforced
          ? 'Declare that private data is in this session: its sandbox loses the network for good'
          : 'Declare that private data is in this session: this kernel is not sandboxed, so it runs no more code in it',
        actions: [MARK_ACTION]
      })
    );
  }
  client.requestState();
  const dialog = new Dialog<void>({
    title: enforced ? 'Sandboxed kernel' : 'Not sandboxed',
    body: new StatusBody(client),
    buttons,
    defaultButton: 0,
    hasClose: true
  });
  dialog.addClass('sk-status-dialog');
  const result = await dialog.launch();
  if (result.button.actions.includes(MARK_ACTION)) {
    await showMarkPrivateDialog(client);
  }
}

interface IMarkChoice {
  level: Level;
  reason: string;
}

class MarkPrivateBody
  extends Widget
  implements Dialog.IBodyWidget<IMarkChoice>
{
  constructor(current: Level, enforced: boolean) {
    super();
    this.addClass('sk-mark-private-body');
    const choices = MARKABLE_LEVELS.filter(
      l => levelRank(l) > levelRank(current)
    );
    this.node.append(
      el(
        'p',
        undefined,
        current === 'PUBLIC'
          ? 'Mark this session as holding private data. Choose how sensitive it is:'
          : `This session is ${current}. Raise it to:`
      )
    );
    const levelLabel = el('label', 'sk-mark-private-field', 'Level ');
    this._select = el('select', 'sk-mark-private-level');
    for (const level of choices) {
      const option = el('option', undefined, level);
      option.value = level;
      this._select.append(option);
    }
    const preferred: Level = choices.includes('CONFIDENTIAL')
      ? 'CONFIDENTIAL'
      : choices[0];
    this._select.value = preferred;
    levelLabel.append(this._select);
    const reasonLabel = el(
      'label',
      'sk-mark-private-field',
      'Reason (optional) '
    );
    this._reason = el('input', 'sk-mark-private-reason');
    this._reason.type = 'text';
    this._reason.maxLength = 1000;
    this._reason.placeholder = 'e.g. loaded the HR export';
    reasonLabel.append(this._reason);
    const warning = el('p', 'sk-mark-private-warning');
    warning.append(
      el('strong', undefined, 'This can never be undone. '),
      document.createTextNode(
        enforced
          ? "The session's sandbox loses all network now and for good: through kernel " +
              'restarts and new kernels on this notebook too. Variables that cannot be ' +
              'carried into the new, network-less sandbox are dropped, and you are told which.'
          : 'This kernel is NOT sandboxed: its network cannot be cut, so it runs no more ' +
              'code in this session, now and for good: through kernel restarts and new ' +
              'kernels on this notebook too.'
      )
    );
    this.node.append(levelLabel, reasonLabel, warning);
  }

  getValue(): IMarkChoice {
    return {
      level: this._select.value as Level,
      reason: this._reason.value.trim()
    };
  }

  private _select: HTMLSelectElement;
  private _reason: HTMLInputElement;
}

/** Ask for a level and a confirmation, then send mark_private. */
export async function showMarkPrivateDialog(
  client: StatusClient
): Promise<void> {
  const current = client.state?.level ?? 'PUBLIC';
  const enforced = client.state?.enforces_network ?? true;
  if (levelRank(current) >= levelRank('SECRET')) {
    return;
  }
  const dialog = new Dialog<IMarkChoice>({
    title: 'Mark session private',
    body: new MarkPrivateBody(current, enforced),
    buttons: [
      Dialog.cancelButton(),
      Dialog.warnButton({
        label: 'Mark private for good',
        className: 'sk-mark-private-confirm'
      })
    ],
    defaultButton: 0,
    focusNodeSelector: 'select',
    hasClose: true
  });
  dialog.addClass('sk-mark-private-dialog');
  const result = await dialog.launch();
  if (!result.button.accept || !result.value) {
    return;
  }
  try {
    await client.markPrivate(
      result.value.level,
      result.value.reason || undefined
    );
  } catch (err) {
    await showErrorMessage(
      'Could not mark the session private',
      err instanceof Error ? err.message : String(err)
    );
  }
}
