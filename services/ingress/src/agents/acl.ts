/**
 * Agent credential ACLs (the `acl` of a credential): entries `*`, `bind:*`, `bind:<host>`,
 * `bind:*.<domain>` (host names compare case-insensitively) and `bind:<key>=<value>` (labels,
 * exact; `bind:<key>=*` allows any value). A credential without `bind:` entries may bind anything.
 */

function bindRules(acl: readonly string[]): string[] {
  return acl.filter((r) => r.startsWith('bind:')).map((r) => r.slice(5));
}

/** May this credential bind `hostname` (lower-case)? */
export function aclAllowsHostname(acl: readonly string[], hostname: string): boolean {
  const rules = bindRules(acl);
  if (rules.length === 0) return true;
  return rules.some((rule) => {
    const pat = rule.toLowerCase();
    if (pat === '*' || pat === hostname) return true;
    const colon = pat.lastIndexOf(':');
    if (colon > 0 && /^\d+$/.test(pat.slice(colon + 1)) && pat.slice(0, colon) === hostname) return true; // host:port entries
    return pat.startsWith('*.') && hostname.endsWith(pat.slice(1)) && hostname.length > pat.length - 1;
  });
}

/** May this credential start a labeled tunnel with all of these labels? */
export function aclAllowsLabels(acl: readonly string[], labels: Readonly<Record<string, string>>): boolean {
  const rules = bindRules(acl);
  if (rules.length === 0 || rules.includes('*')) return true;
  return Object.entries(labels).every(([k, v]) => rules.includes(`${k}=${v}`) || rules.includes(`${k}=*`));
}
