/**
 * One StatusClient per notebook: follows the notebook's kernel, keeps the
 * `sandbox_kernel.status` comm open (re-opening it after kernel restarts and
 * kernel changes) and holds the last state the kernel sent.
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import type { JSONObject } from '@lumino/coreutils';
import type { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import {
  IState,
  Level,
  PROTOCOL_VERSION,
  TARGET,
  helloMessage,
  levelRank,
  markPrivateMessage,
  parseKernelMessage,
  requestStateMessage
} from './protocol';

/** Kernel spec names served by sandbox_kernel. */
export const SANDBOX_KERNEL_NAME = 'sandbox-python';

export function isSandboxKernelName(name: string | null | undefined): boolean {
  return (
    !!name &&
    (name === SANDBOX_KERNEL_NAME || name.startsWith(`${SANDBOX_KERNEL_NAME}-`))
  );
}

/**
 * - `inactive`: the notebook has no kernel.
 * - `unsandboxed`: the notebook runs a kernel that is not sandbox_kernel (its
 *   cells run on the host): shown as a warning, never hidden, so that a
 *   notebook saved with the stock kernel cannot pass for a sandboxed one.
 * - `connecting`: a sandbox kernel; waiting for its first state.
 * - `ready`: `state` holds what the kernel said last.
 * - `unavailable`: the kernel closed the comm (it does not serve the target)
 *   or speaks another protocol version.
 */
export type Phase =
  'inactive' | 'unsandboxed' | 'connecting' | 'ready' | 'unavailable';

export interface ILevelRaised {
  from: Level;
  to: Level;
  notice?: string;
  /** The state that carries the rise (what the popup may say depends on its backend). */
  state: IState;
}

const MARK_PRIVATE_TIMEOUT_MS = 120_000;

interface IPendingMark {
  resolve: (state: IState) => void;
  reject: (err: Error) => void;
  timer: number;
}

export class StatusClient implements IDisposable {
  constructor(readonly sessionContext: ISessionContext) {
    sessionContext.kernelChanged.connect(this._onKernelChanged, this);
    sessionContext.statusChanged.connect(this._onStatusChanged, this);
    sessionContext.connectionStatusChanged.connect(
      this._onConnectionStatusChanged,
      this
    );
    sessionContext.iopubMessage.connect(this._onIopubMessage, this);
    this._attach(sessionContext.session?.kernel ?? null);
  }

  /** Emitted whenever anything shown to the user may have changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Emitted when a state with `changed: true` carries a higher level. */
  get levelRaised(): ISignal<this, ILevelRaised> {
    return this._levelRaised;
  }

  get phase(): Phase {
    return this._phase;
  }

  /** Whether the notebook runs a kernel (the item is shown, sandboxed or not). */
  get isActive(): boolean {
    return this._phase !== 'inactive';
  }

  /** Whether the notebook runs a kernel that is NOT sandboxed. */
  get isUnsandboxed(): boolean {
    return this._phase === 'unsandboxed';
  }

  /** The kernelspec name of the notebook's kernel, if it has one. */
  get kernelName(): string | null {
    return this._kernel?.name ?? null;
  }

  /** The display name of the notebook's kernel ("Python 3 (ipykernel)"), else its name. */
  get kernelDisplayName(): string {
    return this.sessionContext.kernelDisplayName || this.kernelName || '';
  }

  /**
   * Replace the notebook's kernel by the sandboxed one (`sandbox-python`).
   * Resolves once the new kernel connection exists; rejects with the
   * server's error (e.g. the sandboxed kernelspec is not installed).
   */
  async switchToSandbox(): Promise<void> {
    if (this._isDisposed) {
      return;
    }
    const kernel = await this.sessionContext.changeKernel({
      name: SANDBOX_KERNEL_NAME
    });
    if (!kernel || !isSandboxKernelName(kernel.name)) {
      throw new Error(
        `The notebook's kernel is ${kernel ? `"${kernel.name}"` : 'not running'}, not ${SANDBOX_KERNEL_NAME}.`
      );
    }
  }

  get state(): IState | null {
    return this._state;
  }

  /** The last `error` message from the kernel (not tied to a request we made). */
  get lastError(): string | null {
    return this._lastError;
  }

  /** The last `notice` the kernel attached to a state. */
  get lastNotice(): string | null {
    return this._lastNotice;
  }

  get kernelId(): string | null {
    return this._kernel?.id ?? null;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Ask the kernel for its state again. */
  requestState(): void {
    this._send(requestStateMessage());
  }

  /**
   * Ask the kernel to raise the session to `level`. Resolves with the state
   * the kernel answers with; rejects with the kernel's error message.
   */
  markPrivate(level: Level, reason?: string): Promise<IState> {
    const comm = this._comm;
    if (!comm || comm.isDisposed) {
      return Promise.reject(
        new Error(
          'The sandbox kernel is not connected; try again when it is idle.'
        )
      );
    }
    return new Promise<IState>((resolve, reject) => {
      const pending: IPendingMark = {
        resolve,
        reject,
        timer: window.setTimeout(() => {
          this._pending = this._pending.filter(p => p !== pending);
          reject(new Error('The kernel did not answer the request in time.'));
        }, MARK_PRIVATE_TIMEOUT_MS)
      };
      this._pending.push(pending);
      if (!this._send(markPrivateMessage(level, reason))) {
        this._settle(null, 'Could not send the request to the kernel.');
      }
    });
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._closeComm(true);
    this._rejectAll('The notebook was closed.');
    Signal.clearData(this);
  }

  // ---------------------------------------------------------------------

  private _onKernelChanged(
    _: ISessionContext,
    args: { newValue: Kernel.IKernelConnection | null }
  ): void {
    this._attach(args.newValue);
  }

  private _onStatusChanged(_: ISessionContext, status: Kernel.Status): void {
    if (
      !this._kernel ||
      this._phase === 'inactive' ||
      this._phase === 'unsandboxed'
    ) {
      return;
    }
    if (
      status === 'restarting' ||
      status === 'autorestarting' ||
      (status === 'starting' && this._sawLive)
    ) {
      // A restart: the kernel connection disposes every comm on a restart it
      // knows of; a 'starting' after the kernel was up means a new kernel
      // process that another client (or the REST API) restarted, and the old
      // comm is dead too. Keep showing the last state (the ratchet cannot go
      // down) until the new kernel answers.
      if (this._comm && !this._comm.isDisposed) {
        this._comm.dispose();
      }
      this._comm = null;
      this._sawLive = false;
      this._closedByKernel = false;
      this._rejectAll('The kernel restarted.');
      this._setPhase(this._state ? 'ready' : 'connecting');
    } else if (status === 'dead') {
      this._comm = null;
      this._sawLive = false;
      this._rejectAll('The kernel died.');
    } else if (status === 'idle' || status === 'busy') {
      this._sawLive = true;
      if (this._needsComm()) {
        this._openComm();
      }
    }
  }

  /**
   * A restart made by another client (the REST API, nbclient, a second tab)
   * reaches this page only as the old kernel's `shutdown_reply` with
   * `restart: true` (no 'restarting' status): treat it as one, so the comm
   * is re-opened with the new kernel process.
   */
  private _onIopubMessage(
    _: ISessionContext,
    msg: { header: { msg_type: string; session?: string }; content: unknown }
  ): void {
    const content = msg.content as {
      restart?: unknown;
      execution_state?: unknown;
    } | null;
    const session = msg.header.session || null;
    if (
      msg.header.msg_type === 'shutdown_reply' &&
      content &&
      content.restart === true
    ) {
      this._onStatusChanged(this.sessionContext, 'restarting');
      this._restartedSession = session;
      return;
    }
    // After such a restart the page may never see a status *change* from
    // the new kernel process: jupyter_server's iopub socket reconnects to it
    // a moment after it starts (under load, after it began the first cell),
    // so its 'starting' and the cell's 'busy' are lost; the connection's
    // status stayed 'idle' (the old kernel's statuses answer the shutdown
    // request, an untracked type), and the cell's 'idle' changes nothing.
    // Any message of another kernel session than the one that restarted
    // (not a status the server makes itself) says the new process is up;
    // but not ipykernel's iopub_welcome, which can come before the new
    // process's own 'starting' (that would then be taken for one more
    // restart and dispose the comm just opened).
    if (
      this._restartedSession !== null &&
      session !== null &&
      session !== this._restartedSession &&
      !this._sawLive &&
      msg.header.msg_type !== 'iopub_welcome' &&
      (msg.header.msg_type !== 'status' ||
        (content !== null &&
          (content.execution_state === 'busy' ||
            content.execution_state === 'idle')))
    ) {
      this._restartedSession = null;
      this._sawLive = true;
      if (this._needsComm()) {
        this._openComm();
      }
    }
  }

  private _onConnectionStatusChanged(
    _: ISessionContext,
    status: Kernel.ConnectionStatus
  ): void {
    if (status === 'connected' && this._needsComm()) {
      this._openComm();
    }
  }

  private _attach(kernel: Kernel.IKernelConnection | null): void {
    this._closeComm(false);
    this._rejectAll('The kernel changed.');
    this._kernel = kernel;
    this._state = null;
    this._lastError = null;
    this._lastNotice = null;
    this._closedByKernel = false;
    this._sawLive = false;
    this._restartedSession = null;
    if (!kernel) {
      this._setPhase('inactive', true);
      return;
    }
    if (!isSandboxKernelName(kernel.name)) {
      this._setPhase('unsandboxed', true);
      return;
    }
    this._setPhase('connecting', true);
    this._openComm();
  }

  private _needsComm(): boolean {
    return (
      !this._isDisposed &&
      !!this._kernel &&
      !this._kernel.isDisposed &&
      this._phase !== 'inactive' &&
      this._phase !== 'unsandboxed' &&
      !this._closedByKernel &&
      (!this._comm || this._comm.isDisposed)
    );
  }

  private _openComm(): void {
    const kernel = this._kernel;
    if (!kernel || kernel.isDisposed) {
      return;
    }
    let comm: Kernel.IComm;
    try {
      comm = kernel.createComm(TARGET);
    } catch (err) {
      console.warn('sandbox-kernel-status: cannot open the status comm', err);
      return;
    }
    comm.onMsg = msg => this._onCommMsg(comm, msg);
    comm.onClose = () => this._onCommClose(comm);
    this._comm = comm;
    try {
      comm.open(helloMessage()).done.catch(() => undefined);
    } catch (err) {
      console.warn('sandbox-kernel-status: cannot open the status comm', err);
      this._comm = null;
    }
  }

  private _closeComm(notifyKernel: boolean): void {
    const comm = this._comm;
    this._comm = null;
    if (!comm || comm.isDisposed) {
      return;
    }
    try {
      if (notifyKernel && this._kernel && !this._kernel.isDisposed) {
        comm.close().done.catch(() => undefined);
      } else {
        comm.dispose();
      }
    } catch {
      // The kernel connection is going away: nothing to close.
    }
  }

  private _send(
    data:
      | ReturnType<typeof requestStateMessage>
      | ReturnType<typeof markPrivateMessage>
  ): boolean {
    const comm = this._comm;
    if (!comm || comm.isDisposed) {
      return false;
    }
    try {
      comm.send(data as unknown as JSONObject).done.catch(() => undefined);
      return true;
    } catch (err) {
      console.warn(
        'sandbox-kernel-status: cannot send on the status comm',
        err
      );
      return false;
    }
  }

  private _onCommMsg(comm: Kernel.IComm, msg: KernelMessage.ICommMsgMsg): void {
    if (comm !== this._comm || this._isDisposed) {
      return;
    }
    const data = msg.content.data as unknown;
    const parsed = parseKernelMessage(data);
    if (!parsed) {
      const version =
        data && typeof data === 'object'
          ? (data as { version?: unknown }).version
          : undefined;
      if (version !== undefined && version !== PROTOCOL_VERSION) {
        this._lastError = `The kernel speaks status protocol version ${String(
          version
        )}; this extension speaks version ${PROTOCOL_VERSION}.`;
        this._setPhase('unavailable', true);
      }
      console.warn(
        'sandbox-kernel-status: ignoring a comm message that does not fit protocol version 1',
        data
      );
      return;
    }
    if (parsed.type === 'error') {
      if (parsed.request === 'mark_private' && this._pending.length) {
        this._settle(null, parsed.message);
      } else {
        this._lastError = parsed.message;
        console.warn('sandbox-kernel-status: kernel error:', parsed.message);
        this._changed.emit();
      }
      return;
    }
    const previous = this._state;
    this._state = parsed.state;
    if (parsed.notice) {
      this._lastNotice = parsed.notice;
    }
    this._setPhase('ready', true);
    const from: Level = previous ? previous.level : 'PUBLIC';
    // A rise is news when the kernel says so, or when a state we already knew
    // (kept across a restart) is below the new one: a rise that happened while
    // the comm was being re-opened must still be notified.
    if (
      (parsed.changed || previous !== null) &&
      levelRank(parsed.state.level) > levelRank(from)
    ) {
      this._levelRaised.emit({
        from,
        to: parsed.state.level,
        notice: parsed.notice,
        state: parsed.state
      });
    }
    this._settle(parsed.state, null);
  }

  private _onCommClose(comm: Kernel.IComm): void {
    if (comm !== this._comm) {
      return;
    }
    this._comm = null;
    // Closed by the kernel: it does not serve the target (or shut it down).
    // Do not re-open in a loop; a restart or a kernel change tries again.
    this._closedByKernel = true;
    this._rejectAll('The kernel closed the status channel.');
    if (!this._state) {
      this._setPhase('unavailable', true);
    }
  }

  /** Resolve the oldest pending mark_private (state) or reject it (error). */
  private _settle(state: IState | null, error: string | null): void {
    const pending = this._pending.shift();
    if (!pending) {
      return;
    }
    window.clearTimeout(pending.timer);
    if (state) {
      pending.resolve(state);
    } else {
      pending.reject(new Error(error ?? 'The request failed.'));
    }
  }

  private _rejectAll(reason: string): void {
    const pending = this._pending;
    this._pending = [];
    for (const p of pending) {
      window.clearTimeout(p.timer);
      p.reject(new Error(reason));
    }
  }

  private _setPhase(phase: Phase, force = false): void {
    if (phase === this._phase && !force) {
      return;
    }
    this._phase = phase;
    this._changed.emit();
  }

  private _kernel: Kernel.IKernelConnection | null = null;
  private _comm: Kernel.IComm | null = null;
  private _closedByKernel = false;
  private _sawLive = false;
  /** The kernel session whose shutdown_reply said it restarted, until the new process is heard. */
  private _restartedSession: string | null = null;
  private _state: IState | null = null;
  private _lastError: string | null = null;
  private _lastNotice: string | null = null;
  private _phase: Phase = 'inactive';
  private _pending: IPendingMark[] = [];
  private _isDisposed = false;
  private _changed = new Signal<this, void>(this);
  private _levelRaised = new Signal<this, ILevelRaised>(this);
}
