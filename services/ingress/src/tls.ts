import { existsSync } from 'node:fs';
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { createCertificate } from '@warren/shared';

export interface TlsMaterial {
  cert: string;
  key: string;
  /** The CA that signed a generated certificate (agents need it); null for configured files. */
  caPem: string | null;
}

async function writeAtomic(file: string, data: string, mode: number): Promise<void> {
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, data, { mode });
  await rename(tmp, file);
}

/**
 * A local certificate authority and a certificate it signs for `localhost`, `127.0.0.1`, `::1`,
 * `*.warren.localhost` and any extra names, kept in `dir` and reused on later runs. For local
 * runs and tests only: production sets TLS_CERT_FILE and TLS_KEY_FILE.
 */
export async function ensureLocalTls(dir: string, extraNames: string[] = []): Promise<TlsMaterial & { caFile: string }> {
  const caFile = path.join(dir, 'ca.pem');
  const caKeyFile = path.join(dir, 'ca-key.pem');
  const certFile = path.join(dir, 'cert.pem');
  const keyFile = path.join(dir, 'key.pem');
  if (existsSync(caFile) && existsSync(certFile) && existsSync(keyFile)) {
    return { cert: await readFile(certFile, 'utf8'), key: await readFile(keyFile, 'utf8'), caPem: await readFile(caFile, 'utf8'), caFile };
  }
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const ca = await createCertificate({ commonName: 'Warren local CA', days: 3650, ca: true, keyType: 'ec' });
  const leaf = await createCertificate({
    commonName: 'localhost',
    days: 825,
    issuer: ca,
    keyType: 'ec',
    dnsNames: ['localhost', '*.warren.localhost', ...extraNames],
    ipAddresses: ['127.0.0.1', '::1'],
  });
  await writeAtomic(caKeyFile, ca.privateKeyPem, 0o600);
  await writeAtomic(keyFile, leaf.privateKeyPem, 0o600);
  await writeAtomic(certFile, leaf.certificatePem, 0o644);
  await writeAtomic(caFile, ca.certificatePem, 0o644);
  return { cert: leaf.certificatePem, key: leaf.privateKeyPem, caPem: ca.certificatePem, caFile };
}

export async function loadTls(certFile: string | undefined, keyFile: string | undefined, stateDir: string): Promise<TlsMaterial> {
  if (certFile && keyFile) return { cert: await readFile(certFile, 'utf8'), key: await readFile(keyFile, 'utf8'), caPem: null };
  if (certFile || keyFile) throw new Error('set both TLS_CERT_FILE and TLS_KEY_FILE, or neither');
  return ensureLocalTls(path.join(stateDir, 'tls'));
}
