/**
 * CIDR parsing for IP policy rules lives in `@warren/shared` (`services/shared/src/cidr.ts`), so
 * that traffic-policy `restrict-ips` lists are validated exactly like IP policy rules.
 */
export { parseCidr, type CidrResult } from '@warren/shared';
