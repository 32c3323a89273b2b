import { AppError, newId, notFound, rfc3339 } from '@warren/shared';
import type { z } from 'zod';
import type { Db } from '../../db/pool.js';
import type { RequestContext } from '../../http/context.js';
import { envelope, type Page } from '../../http/paginate.js';
import { audit } from '../../events/outbox.js';
import { optionalStrings } from '../common.js';
import { certificateAuthoritiesRepo as repo, type CertificateAuthorityRow } from './certificate-authorities.repo.js';
import { parseCaPem } from './certificate-authorities.pem.js';
import type { CertificateAuthority, CertificateAuthorityCreate, CertificateAuthorityUpdate } from './certificate-authorities.schema.js';

const COLLECTION = 'certificate_authorities';
const EVENT = 'certificate_authority';

export function toCertificateAuthority(row: CertificateAuthorityRow, baseUrl: string): CertificateAuthority {
  return {
    id: row.id,
    uri: `${baseUrl}/${COLLECTION}/${row.id}`,
    created_at: rfc3339(row.created_at),
    ...optionalStrings({ description: row.description, metadata: row.metadata }),
    ca_pem: row.ca_pem,
    subject_common_name: row.subject_common_name,
    not_before: rfc3339(row.not_before),
    not_after: rfc3339(row.not_after),
    key_usages: row.key_usages,
    extended_key_usages: row.extended_key_usages,
  };
}

export function createCertificateAuthoritiesService(deps: { db: Db }) {
  const { db } = deps;
  return {
    async create(ctx: RequestContext, input: z.output<typeof CertificateAuthorityCreate>): Promise<CertificateAuthority> {
      const ca = parseCaPem(input.ca_pem);
      return db.tx(async (q) => {
        const row = await repo.insert(q, {
          id: newId('ca'),
          account_id: ctx.auth.accountId,
          description: input.description ?? '',
          metadata: input.metadata ?? '',
          ca_pem: ca.pem,
          subject_common_name: ca.subjectCommonName,
          not_before: ca.notBefore,
          not_after: ca.notAfter,
          key_usages: ca.keyUsages,
          extended_key_usages: ca.extendedKeyUsages,
        });
        const out = toCertificateAuthority(row, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'created', out);
        return out;
      });
    },

    async get(ctx: RequestContext, id: string): Promise<CertificateAuthority> {
      const row = await repo.get(db, ctx.auth.accountId, id);
      if (!row) throw notFound('certificate authority', id);
      return toCertificateAuthority(row, ctx.baseUrl);
    },

    async list(ctx: RequestContext, page: Page) {
      const rows = await repo.list(db, ctx.auth.accountId, page);
      return envelope(COLLECTION, `${ctx.baseUrl}/${COLLECTION}`, rows.map((r) => toCertificateAuthority(r, ctx.baseUrl)), page);
    },

    async update(ctx: RequestContext, id: string, input: z.output<typeof CertificateAuthorityUpdate>): Promise<CertificateAuthority> {
      return db.tx(async (q) => {
        const before = await repo.get(q, ctx.auth.accountId, id, true);
        if (!before) throw notFound('certificate authority', id);
        const next = { description: input.description ?? before.description, metadata: input.metadata ?? before.metadata };
        if (next.description === before.description && next.metadata === before.metadata) return toCertificateAuthority(before, ctx.baseUrl);
        const row = (await repo.update(q, ctx.auth.accountId, id, next))!;
        const out = toCertificateAuthority(row, ctx.baseUrl);
        await audit(q, ctx, EVENT, 'updated', out);
        return out;
      });
    },

    async delete(ctx: RequestContext, id: string): Promise<void> {
      await db.tx(async (q) => {
        const row = await repo.get(q, ctx.auth.accountId, id, true);
        if (!row) throw notFound('certificate authority', id);
        // The FK (RESTRICT) guards races too; this check gives the caller a useful message.
        const edges = await repo.referencingEdges(q, id);
        if (edges.length > 0)
          throw new AppError(4100, `the certificate authority is listed by the mutual_tls module of HTTPS edge ${edges.join(', ')}; remove it there first`, { resourceId: id });
        await repo.delete(q, ctx.auth.accountId, id);
        await audit(q, ctx, EVENT, 'deleted', toCertificateAuthority(row, ctx.baseUrl));
      });
    },
  };
}
