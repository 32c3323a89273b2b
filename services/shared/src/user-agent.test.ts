import { describe, expect, it } from 'vitest';
import { checkUserAgentPattern } from './user-agent.js';

describe('user agent patterns', () => {
  it('refuse nested quantifiers, which backtrack exponentially, and accept ordinary patterns', () => {
    expect(checkUserAgentPattern('(a+)+$')).toMatch(/backtrack exponentially/);
    expect(checkUserAgentPattern('(\\w*x)*')).toMatch(/backtrack exponentially/);
    for (const ok of ['(?i)curl/.*', '(ab){2,3}', '(?i)(bad|evil)bot', 'Mozilla/5\\.0 .*']) expect(checkUserAgentPattern(ok)).toBeUndefined();
  });
});
