// Error codes (protocol/spec.md section 5, protocol/codes.json) and UdskitError.

/** Code names in number order; index = code for 0..16, plus 32. */
const NAMES: Record<number, string> = {
  0: 'ok', 1: 'canceled', 2: 'unknown', 3: 'invalid_argument', 4: 'deadline_exceeded',
  5: 'not_found', 6: 'already_exists', 7: 'permission_denied', 8: 'resource_exhausted',
  9: 'failed_precondition', 10: 'aborted', 11: 'out_of_range', 12: 'unimplemented',
  13: 'internal', 14: 'unavailable', 15: 'data_loss', 16: 'unauthenticated',
  32: 'protocol_violation',
};

const NUMBERS: Record<string, number> = Object.fromEntries(
  Object.entries(NAMES).map(([n, name]) => [name, Number(n)]),
);

/** A code name from codes.json ('unknown' for numbers it does not list). */
export type CodeName =
  | 'ok' | 'canceled' | 'unknown' | 'invalid_argument' | 'deadline_exceeded' | 'not_found'
  | 'already_exists' | 'permission_denied' | 'resource_exhausted' | 'failed_precondition'
  | 'aborted' | 'out_of_range' | 'unimplemented' | 'internal' | 'unavailable' | 'data_loss'
  | 'unauthenticated' | 'protocol_violation';

/** Code numbers by name. */
export const Code = {
  ok: 0, canceled: 1, unknown: 2, invalid_argument: 3, deadline_exceeded: 4, not_found: 5,
  already_exists: 6, permission_denied: 7, resource_exhausted: 8, failed_precondition: 9,
  aborted: 10, out_of_range: 11, unimplemented: 12, internal: 13, unavailable: 14,
  data_loss: 15, unauthenticated: 16, protocol_violation: 32,
} as const satisfies Record<CodeName, number>;

/** The name of a code number; codes not in codes.json are 'unknown'. */
export function codeName(code: number): CodeName {
  return (NAMES[code] ?? 'unknown') as CodeName;
}

/** The number of a code name, or undefined. */
export function codeNumber(name: string): number | undefined {
  return Object.prototype.hasOwnProperty.call(NUMBERS, name) ? NUMBERS[name] : undefined;
}

/** Whether a call that failed with this code may be sent again (only unavailable). */
export function isRetryable(code: number): boolean {
  return code === Code.unavailable;
}

/**
 * The error every udskit call fails with. `.code` is the name from codes.json,
 * `.number` the code on the wire (kept even when unknown), `.retryable` says the
 * call may be sent again, `.refused` that the server did not process it at all.
 */
export class UdskitError extends Error {
  readonly code: CodeName;
  readonly number: number;
  readonly retryable: boolean;
  readonly refused: boolean;
  /** The error frame's details payload (opaque bytes), if any. */
  readonly details: Buffer | undefined;

  constructor(code: CodeName | number, message: string, opts: { refused?: boolean; details?: Buffer; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'UdskitError';
    this.number = typeof code === 'number' ? code : Code[code];
    this.code = codeName(this.number);
    this.retryable = isRetryable(this.number);
    this.refused = opts.refused === true;
    this.details = opts.details;
  }

  override toString(): string {
    return `UdskitError: ${this.code} (${this.number}): ${this.message}`;
  }
}

/**
 * A protocol error: bytes from the peer that break the wire format. `.name` is
 * the error name from protocol/vectors (truncated, bad_magic, frame_too_large, ...).
 */
export class ProtocolError extends Error {
  constructor(readonly errorName: string, message: string) {
    super(`${errorName}: ${message}`);
    this.name = 'ProtocolError';
  }
}
