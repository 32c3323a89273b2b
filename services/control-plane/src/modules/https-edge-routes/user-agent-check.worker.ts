import { readlinkSync } from 'node:fs';
import { parentPort } from 'node:worker_threads';
// Only this module (and re2js), not all of @warren/shared: the worker starts faster and holds less.
import { userAgentListCostProblem, type UserAgentPatternProblem } from '../../../../shared/src/user-agent.js';

/**
 * Worker thread of `user-agent-check.ts`: explores a user_agent_filter's lists
 * (`userAgentListCostProblem`) off the control plane's event loop. It answers each list as soon
 * as it is done, allow first, so that the parent knows which list a check that ran out of time
 * was on.
 */

export interface CheckRequest {
  id: number;
  allow: string[];
  deny: string[];
}

export type CheckMessage =
  /** `tid`: this thread's id in the kernel (Linux), whose CPU time the parent reads. */
  | { type: 'ready'; tid?: number }
  | { type: 'list'; id: number; list: 'allow' | 'deny'; problem: UserAgentPatternProblem | null }
  | { type: 'failed'; id: number; message: string };

const port = parentPort;
if (!port) throw new Error('user-agent-check.worker.ts runs as a worker thread');

const send = (m: CheckMessage) => port.postMessage(m);

/** This thread's id in the kernel: `/proc/thread-self` links to `<pid>/task/<tid>` (Linux). */
function kernelThreadId(): number | undefined {
  try {
    const tid = Number(readlinkSync('/proc/thread-self').split('/').pop());
    return Number.isInteger(tid) && tid > 0 ? tid : undefined;
  } catch {
    return undefined;
  }
}

port.on('message', (m: CheckRequest) => {
  try {
    for (const [list, patterns] of [['allow', m.allow], ['deny', m.deny]] as const) {
      send({ type: 'list', id: m.id, list, problem: userAgentListCostProblem(list, patterns) ?? null });
    }
  } catch (err) {
    send({ type: 'failed', id: m.id, message: String((err as Error)?.stack ?? err) });
  }
});
// A few small checks first leave re2js's code compiled by the JIT: a first check
// would otherwise spend tens of ms of its time limit on a cold start (~20-60 ms measured).
for (let i = 0; i < 3; i++) userAgentListCostProblem('allow', ['(?i)^curl/\\d+', 'Mozilla/5\\.0 \\(X11;.*', `(?i)(bad|evil)bot${i}`]);
send({ type: 'ready', tid: kernelThreadId() });
