/**
 * The `oauth` module's authorization rules, checked once per sign-in:
 *
 * - With no list set (`email_addresses`, `email_domains`, and for github `organizations` and
 *   `teams`), every user the provider authenticates is allowed, as with ngrok.
 * - Otherwise a user is allowed when any one rule matches (the lists are alternatives, each
 *   documented as "users with/members of … may access"):
 *   - `email_addresses`: one of the user's verified email addresses, compared in lower case;
 *   - `email_domains`: the domain (after the last `@`) of one of the user's verified addresses;
 *   - `organizations` (github): membership of one of the orgs (login, case-insensitive);
 *   - `teams` (github): membership of one of the teams, as `org/team-slug` (case-insensitive).
 * - Only an address the provider vouches for counts: GitHub's `verified` addresses from
 *   /user/emails, OpenID providers' `email` only with `email_verified: true` (Microsoft: see
 *   oauth-providers.ts). Providers that do not say (Facebook, Amazon) count their `email`.
 */

export interface AllowRules {
  emailAddresses: readonly string[];
  emailDomains: readonly string[];
  organizations: readonly string[];
  teams: readonly string[];
}

export function rulesFrom(p: { email_addresses?: string[]; email_domains?: string[]; organizations?: string[]; teams?: string[] }): AllowRules {
  const lower = (l: string[] | undefined) => (l ?? []).map((x) => x.trim().toLowerCase()).filter(Boolean);
  return { emailAddresses: lower(p.email_addresses), emailDomains: lower(p.email_domains).map((d) => d.replace(/^@/, '')), organizations: lower(p.organizations), teams: lower(p.teams) };
}

export function hasRules(r: AllowRules): boolean {
  return r.emailAddresses.length + r.emailDomains.length + r.organizations.length + r.teams.length > 0;
}

/** Whether one of the (verified) addresses is allowed by `email_addresses` or `email_domains`. */
export function emailAllowed(r: AllowRules, verifiedEmails: readonly string[]): boolean {
  for (const raw of verifiedEmails) {
    const e = raw.trim().toLowerCase();
    if (!e) continue;
    if (r.emailAddresses.includes(e)) return true;
    const at = e.lastIndexOf('@');
    if (at > 0 && r.emailDomains.includes(e.slice(at + 1))) return true;
  }
  return false;
}

export function organizationAllowed(r: AllowRules, orgs: readonly string[]): boolean {
  return orgs.some((o) => r.organizations.includes(o.toLowerCase()));
}

/** `teams`: `org/team-slug` pairs. */
export function teamAllowed(r: AllowRules, teams: readonly string[]): boolean {
  return teams.some((t) => r.teams.includes(t.toLowerCase()));
}

/** What a provider knows about a user, the membership lists fetched only when a rule needs them. */
export interface UserFacts {
  verifiedEmails: readonly string[];
  organizations?: () => Promise<readonly string[]>;
  teams?: () => Promise<readonly string[]>;
}

/** True when the user may access the route; fetches memberships lazily, cheapest rule first. */
export async function isAllowed(r: AllowRules, u: UserFacts): Promise<boolean> {
  if (!hasRules(r)) return true;
  if (emailAllowed(r, u.verifiedEmails)) return true;
  if (r.organizations.length > 0 && u.organizations && organizationAllowed(r, await u.organizations())) return true;
  if (r.teams.length > 0 && u.teams && teamAllowed(r, await u.teams())) return true;
  return false;
}

/** The verified address of an OpenID provider's claims, or null (see the module doc). */
export function verifiedOidcEmail(kind: string, claims: Record<string, unknown>, consumerTenant: string): string | null {
  const email = typeof claims.email === 'string' ? claims.email : '';
  if (!email) return null;
  if (kind === 'microsoft') return claims.xms_edov === true || claims.xms_edov === 'true' || claims.xms_edov === 1 || claims.tid === consumerTenant ? email : null;
  return claims.email_verified === true || claims.email_verified === 'true' ? email : null;
}
