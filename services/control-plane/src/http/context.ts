/** Who made a request: the account and the API key used (wire-conventions.md §11 principal). */
export interface AuthContext {
  accountId: string;
  apiKeyId: string;
  apiKeyDescription: string;
}

export interface Principal {
  id: string;
  subject: string;
  source: 'API' | 'Agent';
  credential: { id: string; uri: string };
}

/** What a service needs to know about the caller of one request. */
export interface RequestContext {
  auth: AuthContext;
  /** `PUBLIC_BASE_URL`, without a trailing slash; every uri is built from it. */
  baseUrl: string;
}

export function principalOf(ctx: RequestContext): Principal {
  return {
    id: ctx.auth.apiKeyId,
    subject: ctx.auth.apiKeyDescription,
    source: 'API',
    credential: { id: ctx.auth.apiKeyId, uri: `${ctx.baseUrl}/api_keys/${ctx.auth.apiKeyId}` },
  };
}
