import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { newAuthtoken } from '../../auth/tokens.js';
import { registerTokenResource } from '../token-resources/token-resource.js';

/** Agent credentials: authtokens agents present to ingress; deleting one ends its sessions (FK cascade). */
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
  }, deps.checkQuota);
}
