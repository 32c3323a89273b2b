import { z } from 'zod';
import { boundedString, description, metadata, obj } from '../../http/validate.js';
import { MAX_CA_PEM_BYTES } from './certificate-authorities.pem.js';

export const CertificateAuthorityCreate = obj({
  description: description().nullish(),
  metadata: metadata().nullish(),
  ca_pem: boundedString(MAX_CA_PEM_BYTES, 5003, 'ca_pem')
    .refine((s) => s.trim() !== '', { message: 'ca_pem is required', params: { code: 2103 } })
    .describe('one PEM CERTIFICATE block of a certificate authority, at most 64 KiB'),
});

export const CertificateAuthorityUpdate = obj({
  id: z.string().nullish().describe('ignored; sent by the official clients'),
  description: description().nullish(),
  metadata: metadata().nullish(),
});

export const CertificateAuthorityResponse = z.object({
  id: z.string(),
  uri: z.string(),
  created_at: z.string(),
  description: z.string().optional(),
  metadata: z.string().optional(),
  ca_pem: z.string(),
  subject_common_name: z.string(),
  not_before: z.string(),
  not_after: z.string(),
  key_usages: z.array(z.string()),
  extended_key_usages: z.array(z.string()),
});
export type CertificateAuthority = z.infer<typeof CertificateAuthorityResponse>;

export const CertificateAuthorityList = z.object({
  certificate_authorities: z.array(CertificateAuthorityResponse),
  uri: z.string(),
  next_page_uri: z.string().nullable(),
});
