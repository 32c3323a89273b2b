/**
 * The result variables of the `jwt-validation` action (`jwt-action.ts`), as ngrok names them
 * (https://ngrok.com/docs/traffic-policy/actions/jwt-validation, "Action Result Variables"):
 * `actions.ngrok.jwt_validation.tokens[i].{header, payload, signature, verified, location,
 * location_property}` and `actions.ngrok.jwt_validation.error.{code, message}` (also under
 * `actions.service`). Registered as CEL types in `cel.ts`, bounded in `cost.ts`; one instance
 * per request (`CelActionResults`), overwritten by each run of the action.
 *
 * Kept apart from `jwt-action.ts` (which imports `parse.ts`): `cel-vars.ts` needs these classes
 * and `parse.ts` imports `cel.ts`.
 */

/** Most tokens one action reads (`http.tokens`): bounds `tokens` for the cost estimate too. */
export const JWT_MAX_TOKENS = 4;

/** `actions.ngrok.jwt_validation.error`: empty unless the last run failed. */
export class CelJwtValidationError {
  code = '';
  message = '';
}

/**
 * A decoded JSON value as CEL sees it: objects as maps, whole numbers that fit a double
 * exactly as `int` (as ngrok reads `exp`, `iat`, …), other numbers as `double`.
 */
export function jsonToCel(v: unknown): unknown {
  if (typeof v === 'number') return Number.isSafeInteger(v) ? BigInt(v) : v;
  if (Array.isArray(v)) return v.map(jsonToCel);
  if (v !== null && typeof v === 'object') return new Map(Object.entries(v).map(([k, e]) => [k, jsonToCel(e)]));
  return v;
}

/** `actions.ngrok.jwt_validation.tokens[i]`: one token the action read. */
export class CelJwtToken {
  private h?: Map<string, unknown>;
  private p?: Map<string, unknown>;
  constructor(
    /** The decoded JOSE header and claims (plain JSON), converted for CEL on first read. */
    private readonly rawHeader: Record<string, unknown>,
    private readonly rawPayload: Record<string, unknown>,
    /** The third part of the compact JWS, base64url as sent. */
    readonly signature: string,
    /** True when the signature and the claims were verified. */
    readonly verified: boolean,
    /** Where the token was: `header` or `body` (a form or JSON body field). */
    readonly location: string,
    /** The header's or body field's name, as configured (`Authorization`, `_id_token`). */
    readonly location_property: string,
  ) {}
  get header(): Map<string, unknown> {
    return (this.h ??= jsonToCel(this.rawHeader) as Map<string, unknown>);
  }
  get payload(): Map<string, unknown> {
    return (this.p ??= jsonToCel(this.rawPayload) as Map<string, unknown>);
  }
}

/** `actions.ngrok.jwt_validation`. */
export class CelJwtValidation {
  /** The tokens of the last run, in `http.tokens` order (those found and decoded). */
  tokens: CelJwtToken[] = [];
  readonly error = new CelJwtValidationError();

  /** Resets the variables for a new run of the action. */
  reset(): void {
    this.tokens = [];
    this.error.code = '';
    this.error.message = '';
  }
}
