import type { Db } from '../db/pool.js';
import type { Authenticator } from '../auth/authenticate.js';

/** What resource modules receive when they register their routes. */
export interface ModuleDeps {
  db: Db;
  authenticator: Authenticator;
  /** Hostname used for new reserved TCP addresses. */
  tcpAddrHost: string;
}
