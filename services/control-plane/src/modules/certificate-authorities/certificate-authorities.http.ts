import type { ApiRoutes } from '../../http/router.js';
import type { ModuleDeps } from '../../http/deps.js';
import { parseBody } from '../../http/validate.js';
import { parsePage } from '../../http/paginate.js';
import { createCertificateAuthoritiesService } from './certificate-authorities.service.js';
import {
  CertificateAuthorityCreate,
  CertificateAuthorityList,
  CertificateAuthorityResponse,
  CertificateAuthorityUpdate,
} from './certificate-authorities.schema.js';

const tag = 'Certificate authorities';

export function registerCertificateAuthorities(routes: ApiRoutes, deps: ModuleDeps): void {
  const svc = createCertificateAuthoritiesService(deps);
  routes.route(
    '/certificate_authorities',
    {
      POST: async (req) => ({ status: 201, body: await svc.create(req.ctx, parseBody(CertificateAuthorityCreate, req.body)) }),
      GET: async (req) => ({ status: 200, body: await svc.list(req.ctx, parsePage(req.query, 'ca')) }),
    },
    {
      POST: { tag, summary: 'Upload a certificate authority', request: CertificateAuthorityCreate, response: CertificateAuthorityResponse, status: 201 },
      GET: { tag, summary: 'List certificate authorities', response: CertificateAuthorityList, status: 200, paged: true },
    },
  );
  routes.route(
    '/certificate_authorities/:id',
    {
      GET: async (req) => ({ status: 200, body: await svc.get(req.ctx, req.params.id!) }),
      PATCH: async (req) => ({ status: 200, body: await svc.update(req.ctx, req.params.id!, parseBody(CertificateAuthorityUpdate, req.body)) }),
      DELETE: async (req) => {
        await svc.delete(req.ctx, req.params.id!);
        return { status: 204 };
      },
    },
    {
      GET: { tag, summary: 'Get a certificate authority', response: CertificateAuthorityResponse, status: 200 },
      PATCH: { tag, summary: 'Update a certificate authority', request: CertificateAuthorityUpdate, response: CertificateAuthorityResponse, status: 200 },
      DELETE: { tag, summary: 'Delete a certificate authority', status: 204 },
    },
  );
}
