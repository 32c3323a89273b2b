import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule } from './common.js';
import { applyHeaderEdits, compileHeaderEdits, type HeadersModule } from './header-edits.js';

/**
 * `request_headers`: removes then adds headers of the request sent on to the agent (see
 * header-edits.ts; `add` replaces existing values of the same name). `Host` is kept: the route
 * was matched by it and the agent needs it.
 */
export const requestHeadersStage: StageFactory = (route): RouteStage | null => {
  const m = enabledModule<HeadersModule>(route, 'request_headers');
  const edits = m && compileHeaderEdits(m, ['host']);
  if (!edits) return null;
  return {
    name: 'request_headers',
    onRequest: (s) => {
      applyHeaderEdits(s.headers, edits);
      return null;
    },
  };
};
