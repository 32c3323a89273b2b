import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { newAuthtoken } from '../../auth/tokens.js';
import { registerTokenResource } from '../token-resources/token-resource.js';
import { presenceRepo, writeSessionEvents } from '../../config-push/presence.repo.js';

/**
 * Agent credentials: authtokens agents present to ingress. Deleting one ends its sessions: they
 * are removed first (with their tunnels, announced), so their `agent_session_stop.v0` events are
 * written in the same transaction, before the credential's `tunnel_credential_deleted.v0`; the
 * ingress then ends the agents' connections and their `sessionDown` finds nothing left.
 */
export function registerCredentials(routes: ApiRoutes, deps: ModuleDeps): void {
  registerTokenResource(routes, deps.db, {
    table: 'credentials',
    collection: 'credentials',
    listKey: 'credentials',
    prefix: 'cr',
    eventStem: 'tunnel_credential',
    what: 'credential',
    tag: 'Credentials',
    newToken: newAuthtoken,
    acl: true,
    beforeDelete: async (q, ctx, id) => {
      const ended = await presenceRepo.deleteSessionsOfCredential(q, id);
      if (ended.length > 0) return (q) => writeSessionEvents(q, ctx.baseUrl, { stop: ended });
    },
  }, deps.checkQuota);
}
