/**
 * The client's address as policies, headers, events and the agent listener show it: a dual-stack
 * listener (`::`) reports an IPv4 client as `::ffff:a.b.c.d`, which is shown as `a.b.c.d` (as
 * ngrok does, and as an IPv4 listener would), so `conn.client_ip == '1.2.3.4'`, `X-Forwarded-For`,
 * rate-limit keys and per-address caps do not depend on how the ingress listens.
 */
export function remoteIp(socket: { remoteAddress?: string }): string {
  const a = socket.remoteAddress ?? '';
  return a.length > 7 && a.charCodeAt(0) === 58 /* : */ && /^::ffff:\d+\.\d+\.\d+\.\d+$/i.test(a) ? a.slice(7) : a;
}
