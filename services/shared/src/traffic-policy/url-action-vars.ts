/**
 * The result variables of the `url-rewrite` and `redirect` actions (`url-actions.ts`), as ngrok
 * documents them (https://ngrok.com/docs/traffic-policy/actions/url-rewrite#action-result-variables,
 * https://ngrok.com/docs/traffic-policy/actions/redirect#action-result-variables):
 * `actions.ngrok.url_rewrite.{matches, url, error.code, error.message}` and the same under
 * `actions.ngrok.redirect`. Registered as CEL types in `cel.ts`; one instance per request
 * (`CelActionResults`), overwritten by each run of the action ("only the last execution").
 */

/** `actions.ngrok.<url_rewrite|redirect>.error`: empty unless the last run failed. */
export class CelUrlActionError {
  code = '';
  message = '';
}

/** `actions.ngrok.<url_rewrite|redirect>`. */
export class CelUrlActionResult {
  /**
   * The first match of `from` and its capture groups (`[whole match, $1, $2, …]`, `""` for a
   * group that did not take part; at most `URL_ACTION_LIMITS.resultGroups` entries); the whole
   * URL when `from` is omitted; `[]` when nothing matched.
   */
  matches: string[] = [];
  /**
   * url-rewrite: the URL as the upstream gets it after the action (unchanged when nothing
   * matched). redirect: the `Location` sent; `""` when the action did not redirect.
   */
  url = '';
  readonly error = new CelUrlActionError();

  /** Resets the variables for a new run of the action. */
  reset(): void {
    this.matches = [];
    this.url = '';
    this.error.code = '';
    this.error.message = '';
  }
}
