import type { StageFactory } from '../pipeline/types.js';
import { enabledModule } from './common.js';

/**
 * saml is not enforced by this ingress yet (oidc and oauth are: oidc.ts, oauth.ts). A route that
 * enables it must not be served unauthenticated: the factory refuses it, and the routing table makes that
 * route answer 503 (ERR_WARREN_7010) while the rest of the config applies.
 */
export const unenforcedAuthStage: StageFactory = (route) => {
  for (const name of ['saml']) {
    if (enabledModule(route, name)) throw new Error(`the ${name} module is not enforced by this ingress yet`);
  }
  return null;
};
