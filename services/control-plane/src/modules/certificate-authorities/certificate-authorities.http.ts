import type { ApiRoutes } from '../../http/router.js';
import { registerCrud } from '../../http/crud.js';
import type { ModuleDeps } from '../../http/deps.js';
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
  registerCrud(
    routes,
    {
      path: '/certificate_authorities',
      table: 'certificate_authorities',
      idPrefix: 'ca',
      tag,
      names: ['a certificate authority', 'certificate authorities'],
      create: CertificateAuthorityCreate,
      update: CertificateAuthorityUpdate,
      response: CertificateAuthorityResponse,
      list: CertificateAuthorityList,
      summaries: { POST: 'Upload a certificate authority' },
    },
    svc,
    deps.checkQuota,
  );
}
