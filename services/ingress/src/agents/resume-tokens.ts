import { createHmac, hkdfSync, timingSafeEqual } from 'node:crypto';

/**
 * Opaque values we hand to agents so that, after a reconnect, they can keep their session id
 * (Auth `Extra.Cookie`) and their tunnel ids (Bind `Extra.Token`, and our StartTunnelWithLabel
 * extension). Each is an HMAC over the id and the credential id, so only the same credential can
 * resume, and only ids we issued. Any node with the same key accepts them.
 */
export class ResumeTokens {
  private readonly key: Buffer;

  constructor(key: string | Buffer) {
    this.key = Buffer.isBuffer(key) ? key : Buffer.from(key, 'utf8');
    if (this.key.length < 16) throw new Error('the resume key must be at least 16 bytes');
  }

  /**
   * A key derived (HKDF) from a secret the nodes already share: the private key of the agent
   * listener's TLS certificate. Tokens then survive restarts and are accepted by every node
   * serving that certificate; rotating the certificate invalidates them (agents get new ids).
   */
  static deriveKey(secret: string | Buffer): Buffer {
    return Buffer.from(hkdfSync('sha256', secret, Buffer.alloc(0), 'warren agent resume tokens v1', 32));
  }

  /** `<sessionId>.<mac>` */
  sessionCookie(sessionId: string, credentialId: string): string {
    return `${sessionId}.${this.mac('session', sessionId, credentialId)}`;
  }

  verifySessionCookie(cookie: string, sessionId: string, credentialId: string): boolean {
    const dot = cookie.lastIndexOf('.');
    if (dot < 0 || cookie.slice(0, dot) !== sessionId) return false;
    return this.equal(cookie.slice(dot + 1), this.mac('session', sessionId, credentialId));
  }

  tunnelToken(tunnelId: string, credentialId: string): string {
    return this.mac('tunnel', tunnelId, credentialId);
  }

  verifyTunnelToken(token: string, tunnelId: string, credentialId: string): boolean {
    return this.equal(token, this.mac('tunnel', tunnelId, credentialId));
  }

  private mac(kind: string, id: string, credentialId: string): string {
    return createHmac('sha256', this.key).update(`${kind}\0${id}\0${credentialId}`).digest('base64url');
  }

  private equal(a: string, b: string): boolean {
    const x = Buffer.from(a);
    const y = Buffer.from(b);
    return x.length === y.length && timingSafeEqual(x, y);
  }
}
