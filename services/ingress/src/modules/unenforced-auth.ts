import type { StageFactory } from '../pipeline/types.js';
import { enabledModule } from './common.js';

/**
 * oauth and saml are not enforced by this ingress yet (oidc is: oidc.ts). A route that enables
 * one must not be served unauthenticated: the factory refuses it, and the routing table makes that
 * route answer 503 (ERR_WARREN_7010) while the rest of the config applies.
 */
export const unenforcedAuthStage: StageFactory = (route) => {
  for (const name of ['oauth', 'saml']) {
    if (enabledModule(route, name)) throw new Error(`the ${name} module is not enforced by this ingress yet`);
  }
  return null;
};
