import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { newApiKeyToken } from '../../auth/tokens.js';
import { notLastApiKey, registerTokenResource } from '../token-resources/token-resource.js';

export function registerApiKeys(routes: ApiRoutes, deps: ModuleDeps): void {
  registerTokenResource(routes, deps.db, {
    table: 'api_keys',
    collection: 'api_keys',
    listKey: 'keys',
    prefix: 'ak',
    eventStem: 'api_key',
    what: 'API key',
    tag: 'API keys',
    newToken: newApiKeyToken,
    acl: false,
    beforeDelete: notLastApiKey,
    // Stop honouring the key on this replica at once (others within the auth cache TTL).
    afterDelete: (id) => deps.authenticator.forgetKey(id),
  }, deps.checkQuota);
}
