import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule } from './common.js';
import { applyHeaderEdits, compileHeaderEdits, type HeadersModule } from './header-edits.js';

/**
 * `request_headers`: removes then adds headers of the request sent on to the agent (see
 * header-edits.ts; `add` replaces existing values of the same name). `add` with `Host` rewrites
 * the Host sent upstream (ngrok's "Rewrite Host header"); routing, events and X-Forwarded-Host
 * keep the client's. `remove` never removes Host.
 */
export const requestHeadersStage: StageFactory = (route): RouteStage | null => {
  const m = enabledModule<HeadersModule>(route, 'request_headers');
  const edits = m && compileHeaderEdits(m, 'request', 'request_headers');
  if (!edits) return null;
  return {
    name: 'request_headers',
    onRequest: (s) => {
      applyHeaderEdits(s.headers, edits);
      return null;
    },
  };
};
