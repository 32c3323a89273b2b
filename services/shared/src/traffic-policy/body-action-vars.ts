/**
 * The result variables of the `verify-webhook` and `compress-response` actions
 * (`body-actions.ts`), as ngrok documents them:
 * - https://ngrok.com/docs/traffic-policy/actions/verify-webhook#action-result-variables:
 *   `actions.ngrok.verify_webhook.{verified, error.code, error.message}`;
 * - https://ngrok.com/docs/traffic-policy/variables/action (Compress Response):
 *   `actions.ngrok.compress.{already_compressed, negotiated_algorithm}`.
 * Registered as CEL types in `cel.ts`; one instance per request (`CelActionResults`), overwritten
 * by each run of the action ("only the last execution").
 */

/** `actions.ngrok.verify_webhook.error`: empty unless the last run did not verify the request. */
export class CelVerifyWebhookError {
  /** `verification_failed` (a missing, malformed, stale or wrong signature) or `''`. */
  code = '';
  /** Why, e.g. `missing X-Hub-Signature-256 header`; never a secret. */
  message = '';
}

/** `actions.ngrok.verify_webhook`. */
export class CelVerifyWebhook {
  /** The request carried a valid signature of the configured provider. */
  verified = false;
  readonly error = new CelVerifyWebhookError();

  /** One run's result: verified, or not and why (no reason for an answered handshake). */
  record(verified: boolean, errorCode = '', errorMessage = ''): void {
    this.verified = verified;
    this.error.code = errorCode;
    this.error.message = errorMessage;
  }
}

/** `actions.ngrok.compress`. */
export class CelCompress {
  /** The upstream's response already had a `Content-Encoding` (other than identity): nothing was done. */
  already_compressed = false;
  /** The coding the action applied (`br`, `gzip`, `deflate`), `''` when it did not compress. */
  negotiated_algorithm = '';
}
