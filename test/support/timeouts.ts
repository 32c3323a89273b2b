/**
 * How long tests wait for a process they spawn to come up, and the hook and test timeouts that
 * must hold those waits.
 *
 * These waits are hang detectors, not performance checks: `node --import tsx <main>` takes about a
 * second on an idle machine and many times that when two full runs (3 forked workers each, every
 * worker starting a control plane, ingress nodes and agents) share two cores. A wait that fires
 * names the process and shows its output; vitest's own "Hook timed out" names nothing, so a hook
 * or test that starts processes gets a timeout above the sum of the waits it contains (the
 * `*_MS` sums below), and the wait fires first.
 */

/** A control plane's 'listening' message and /readyz (`startControlPlane`). */
export const CONTROL_PLANE_START_MS = 90_000;
/** An ingress node's 'listening' message (`startIngress`). */
export const INGRESS_START_MS = 90_000;
/** Our agent's first line of output, e.g. `online` (`startAgentProcess(...).waitForOutput`). */
export const AGENT_ONLINE_MS = 60_000;
/** The event worker's 'listening' message (`startEventWorker`). */
export const WORKER_START_MS = 90_000;
/** A run of a short CLI (`node --import tsx <cli>`) to its exit, e.g. events-admin. */
export const CLI_RUN_MS = 60_000;

/** Room in a hook or test for what it does besides starting processes (a database, API calls, config pushes). */
export const WORK_MS = 60_000;

/**
 * A beforeAll that starts a cluster: a control plane, then its ingress nodes (at once), then one
 * agent (or several at once), with a fresh database and a few routes (`startPolicyCluster`,
 * `startSignInCluster`, or the same steps by hand).
 */
export const CLUSTER_HOOK_MS = CONTROL_PLANE_START_MS + INGRESS_START_MS + AGENT_ONLINE_MS + WORK_MS;

/** A beforeAll that starts a control plane, then its ingress nodes (at once), and no agent. */
export const NODES_HOOK_MS = CONTROL_PLANE_START_MS + INGRESS_START_MS + WORK_MS;
