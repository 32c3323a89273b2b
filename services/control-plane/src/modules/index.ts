import type { ApiRoutes } from '../http/router.js';
import type { ModuleDeps } from '../http/deps.js';
import { registerReservedAddrs } from './reserved-addrs/reserved-addrs.http.js';
import { registerTunnelGroupBackends } from './tunnel-group-backends/tunnel-group-backends.http.js';
import { registerCertificateAuthorities } from './certificate-authorities/certificate-authorities.http.js';
import { registerHttpsEdges } from './https-edges/https-edges.http.js';
import { registerHttpsEdgeRoutes } from './https-edge-routes/https-edge-routes.http.js';
import { registerIpPolicies } from './ip-policies/ip-policies.http.js';
import { registerEventDestinations } from './event-destinations/event-destinations.http.js';
import { registerEventSubscriptions } from './event-subscriptions/event-subscriptions.http.js';
import { registerApiKeys } from './api-keys/api-keys.http.js';
import { registerCredentials } from './credentials/credentials.http.js';
import { registerTunnels } from './tunnels/tunnels.http.js';

/** Every resource of the management API, in one place. */
export function registerAllModules(routes: ApiRoutes, deps: ModuleDeps): void {
  registerReservedAddrs(routes, deps);
  registerTunnelGroupBackends(routes, deps);
  registerCertificateAuthorities(routes, deps);
  registerHttpsEdges(routes, deps);
  registerHttpsEdgeRoutes(routes, deps);
  registerIpPolicies(routes, deps);
  registerEventDestinations(routes, deps);
  registerEventSubscriptions(routes, deps);
  registerApiKeys(routes, deps);
  registerCredentials(routes, deps);
  registerTunnels(routes, deps);
}
