import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';

// Placeholder until this resource lands; registers nothing.
export function registerHttpsEdges(_routes: ApiRoutes, _deps: ModuleDeps): void {}
