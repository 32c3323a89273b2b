import type { Db } from '../db/pool.js';
import type { Authenticator } from '../auth/authenticate.js';
import type { QuotaCheck } from '../auth/quotas.js';
import type { UserAgentChecks } from '../modules/https-edge-routes/user-agent-check.js';

/** What resource modules receive when they register their routes. */
export interface ModuleDeps {
  db: Db;
  authenticator: Authenticator;
  /** Account quota per resource type, checked before every create. */
  checkQuota: QuotaCheck;
  /** Hostname used for new reserved TCP addresses. */
  tcpAddrHost: string;
  /** The save-time cost check of user_agent_filter lists, in worker threads. */
  userAgentChecks: UserAgentChecks;
}
