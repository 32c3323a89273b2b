import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule } from './common.js';
import { applyHeaderEdits, compileHeaderEdits, type HeadersModule } from './header-edits.js';

/**
 * `response_headers`: removes then adds headers of the upstream's response on its way to the
 * client (see header-edits.ts; `add` replaces existing values of the same name). Applied to
 * the upstream's responses and to the route's own answers (a stage's refusal or custom response,
 * through `deliverAnswer` in http/proxy.ts), not to the ingress's own error answers.
 */
export const responseHeadersStage: StageFactory = (route): RouteStage | null => {
  const m = enabledModule<HeadersModule>(route, 'response_headers');
  const edits = m && compileHeaderEdits(m, 'response', 'response_headers');
  if (!edits) return null;
  return {
    name: 'response_headers',
    onResponse: (_s, r) => {
      applyHeaderEdits(r.headers, edits);
    },
  };
};
