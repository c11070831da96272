/**
 * The `sandbox_kernel.status` comm protocol, version 1 (see docs/comm.md).
 *
 * Everything that arrives from the kernel is checked here before the UI
 * believes it; a message that does not fit is dropped with a console warning.
 */

export const TARGET = 'sandbox_kernel.status';
export const PROTOCOL_VERSION = 1;

/** Sensitivity levels, lowest first. */
export const LEVELS = ['PUBLIC', 'INTERNAL', 'CONFIDENTIAL', 'SECRET'] as const;
export type Level = (typeof LEVELS)[number];
/** Levels the user may ask for with mark_private. */
export const MARKABLE_LEVELS: ReadonlyArray<Level> = [
  'INTERNAL',
  'CONFIDENTIAL',
  'SECRET'
];

export type Network = 'proxied' | 'full' | 'none';
export type Backend = 'bwrap' | 'docker' | 'subprocess';

export interface IDataset {
  name: string;
  level: Level;
  source: string;
  added_at: string;
}

/** One connection through the egress proxy (PROXIED mode). */
export interface IEgressEntry {
  time: string;
  host: string;
  port: number;
  allowed: boolean;
  rule: string;
  bytes_down: number;
  /** How many connections it stands for: the log counts identical refusals as one entry. */
  count: number;
}

/** The egress log's summary (PROXIED mode only). */
export interface IEgress {
  allowed: number;
  refused: number;
  cut: boolean;
  domains: string[];
  recent: IEgressEntry[];
}

export interface IState {
  egress?: IEgress;
  private: boolean;
  level: Level;
  network: Network;
  datasets: IDataset[];
  error: string | null;
  backend: Backend;
  /**
   * Whether a rise really cuts the network on this backend. False on the
   * development subprocess fallback: there the network is NOT cut and the
   * kernel runs no more code once private.
   */
  enforces_network: boolean;
  warnings: string[];
  user_id: string;
  session_id: string;
}

export interface IStateMessage {
  version: 1;
  type: 'state';
  state: IState;
  changed: boolean;
  notice?: string;
}

export interface IErrorMessage {
  version: 1;
  type: 'error';
  request?: string;
  message: string;
}

export type KernelMessage = IStateMessage | IErrorMessage;

/** frontend -> kernel */
export function helloMessage(): { version: 1; type: 'hello' } {
  return { version: PROTOCOL_VERSION, type: 'hello' };
}

export function requestStateMessage(): { version: 1; type: 'request_state' } {
  return { version: PROTOCOL_VERSION, type: 'request_state' };
}

export function markPrivateMessage(
  level: Level,
  reason?: string
): { version: 1; type: 'mark_private'; level: Level; reason?: string } {
  const msg: {
    version: 1;
    type: 'mark_private';
    level: Level;
    reason?: string;
  } = { version: PROTOCOL_VERSION, type: 'mark_private', level };
  if (reason) {
    msg.reason = reason;
  }
  return msg;
}

export function levelRank(level: Level): number {
  return LEVELS.indexOf(level);
}

export function isLevel(value: unknown): value is Level {
  return (
    typeof value === 'string' &&
    (LEVELS as ReadonlyArray<string>).includes(value)
  );
}

function isStringArray(value: unknown): value is string[] {
  return Array.isArray(value) && value.every(v => typeof v === 'string');
}

function parseDataset(value: unknown): IDataset | null {
  if (!value || typeof value !== 'object' || Array.isArray(value)) {
    return null;
  }
  const d = value as Record<string, unknown>;
  if (typeof d.name !== 'string' || !isLevel(d.level)) {
    return null;
  }
  return {
    name: d.name,
    level: d.level,
    source: typeof d.source === 'string' ? d.source : String(d.source ?? ''),
    added_at:
      typeof d.added_at === 'string' ? d.added_at : String(d.added_at ?? '')
  };
}

function count(value: unknown): number {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0
    ? Math.floor(value)
    : 0;
}

/** How many connections an egress entry stands for: a positive integer, else 1. */
function times(value: unknown): number {
  return typeof value === 'number' && Number.isFinite(value) && value >= 1
    ? Math.floor(value)
    : 1;
}

/**
 * Whether the backend cuts the network on a rise. Only a backend that says
 * so, or one of the two that do when an older kernel says nothing; never the
 * subprocess fallback: a popup claiming a cut that did not happen would make
 * a user trust a session that keeps nothing in.
 */
function enforcesNetwork(backend: string, claimed: unknown): boolean {
  if (backend === 'subprocess') {
    return false;
  }
  if (typeof claimed === 'boolean') {
    return claimed;
  }
  return backend === 'bwrap' || backend === 'docker';
}

/** The egress summary, or undefined when absent or malformed (never trusted as markup). */
function parseEgress(value: unknown): IEgress | undefined {
  if (!value || typeof value !== 'object' || Array.isArray(value)) {
    return undefined;
  }
  const e = value as Record<string, unknown>;
  const recent: IEgressEntry[] = [];
  for (const item of Array.isArray(e.recent) ? e.recent.slice(-10) : []) {
    if (!item || typeof item !== 'object') {
      continue;
    }
    const r = item as Record<string, unknown>;
    recent.push({
      time: String(r.time ?? '').slice(0, 40),
      host: String(r.host ?? '').slice(0, 253),
      port: count(r.port),
      allowed: r.allowed === true,
      rule: String(r.rule ?? '').slice(0, 300),
      bytes_down: count(r.bytes_down),
      count: times(r.count)
    });
  }
  return {
    allowed: count(e.allowed),
    refused: count(e.refused),
    cut: e.cut === true,
    domains: isStringArray(e.domains) ? e.domains.slice(0, 50) : [],
    recent
  };
}

/** Check a state object; return null if it does not fit the contract. */
export function parseState(value: unknown): IState | null {
  if (!value || typeof value !== 'object' || Array.isArray(value)) {
    return null;
  }
  const s = value as Record<string, unknown>;
  if (
    typeof s.private !== 'boolean' ||
    !isLevel(s.level) ||
    (s.network !== 'proxied' && s.network !== 'full' && s.network !== 'none') ||
    !Array.isArray(s.datasets) ||
    !(s.error === null || typeof s.error === 'string') ||
    typeof s.backend !== 'string' ||
    !isStringArray(s.warnings) ||
    typeof s.user_id !== 'string' ||
    typeof s.session_id !== 'string'
  ) {
    return null;
  }
  const datasets: IDataset[] = [];
  for (const item of s.datasets) {
    const ds = parseDataset(item);
    if (!ds) {
      return null;
    }
    datasets.push(ds);
  }
  const egress = parseEgress(s.egress);
  return {
    ...(egress ? { egress } : {}),
    private: s.private,
    level: s.level,
    network: s.network,
    datasets,
    error: s.error,
    backend: s.backend as Backend,
    enforces_network: enforcesNetwork(s.backend, s.enforces_network),
    warnings: s.warnings,
    user_id: s.user_id,
    session_id: s.session_id
  };
}

/** Check a kernel -> frontend message; return null if it does not fit. */
export function parseKernelMessage(data: unknown): KernelMessage | null {
  if (!data || typeof data !== 'object' || Array.isArray(data)) {
    return null;
  }
  const m = data as Record<string, unknown>;
  if (m.version !== PROTOCOL_VERSION) {
    return null;
  }
  if (m.type === 'state') {
    const state = parseState(m.state);
    if (!state) {
      return null;
    }
    const msg: IStateMessage = {
      version: PROTOCOL_VERSION,
      type: 'state',
      state,
      changed: m.changed === true
    };
    if (typeof m.notice === 'string' && m.notice) {
      msg.notice = m.notice;
    }
    return msg;
  }
  if (m.type === 'error' && typeof m.message === 'string') {
    const msg: IErrorMessage = {
      version: PROTOCOL_VERSION,
      type: 'error',
      message: m.message
    };
    if (typeof m.request === 'string') {
      msg.request = m.request;
    }
    return msg;
  }
  return null;
}
