import { randomBytes } from 'node:crypto';

/**
 * Static self-signed CA certificates (P-256, valid until 2126), made with
 * `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -subj "/CN=Warren Test CA" -days 36500
 *  -addext basicConstraints=critical,CA:TRUE,pathlen:1 -addext keyUsage=critical,digitalSignature,keyCertSign,cRLSign
 *  -addext extendedKeyUsage=serverAuth,clientAuth`. Static on purpose: @peculiar/x509 needs a reflect
 * polyfill the repository does not ship, and the private keys are not needed.
 */
export const CA_PEM = `-----BEGIN CERTIFICATE-----
MIIBvDCCAWOgAwIBAgIUXmx4uOIZAIiI15/JjMixnITPlzAwCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOV2FycmVuIFRlc3QgQ0EwIBcNMjYxMTIyMjA0NDU4WhgPMjEy
NjEwMjkyMDQ0NThaMBkxFzAVBgNVBAMMDldhcnJlbiBUZXN0IENBMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEsIQvHxLlNNnHKwPxtn26Eax0K7RTeGElP5a5l+9N
ylrEgR4CZdRSBeS9edOnAQ2vE8KfhuOc3CCkH/MYaoXecaOBhjCBgzAdBgNVHQ4E
FgQUT6ui8D3+hgEGARFpVp0BYxnG+KQwHwYDVR0jBBgwFoAUT6ui8D3+hgEGARFp
Vp0BYxnG+KQwEgYDVR0TAQH/BAgwBgEB/wIBATAOBgNVHQ8BAf8EBAMCAYYwHQYD
VR0lBBYwFAYIKwYBBQUHAwEGCCsGAQUFBwMCMAoGCCqGSM49BAMCA0cAMEQCIGIU
uoIOr+pT61Jx0936rfcr2GaOUD+0fw67zK/RXDhWAiB6BZ/Tyy/ojVnKNpiByVUF
/dbtG9Bqkg44RG4Yhtmrnw==
-----END CERTIFICATE-----
`;

/** Like CA_PEM but CN "Warren Test CA 2", keyUsage keyCertSign + cRLSign, no extended key usage. */
export const CA2_PEM = `-----BEGIN CERTIFICATE-----
MIIBnTCCAUOgAwIBAgIUMeRWzaidlVM8uKEx2HSf1Mx4e44wCgYIKoZIzj0EAwIw
GzEZMBcGA1UEAwwQV2FycmVuIFRlc3QgQ0EgMjAgFw0yNjExMjIyMDQ0NThaGA8y
MTI2MTAyOTIwNDQ1OFowGzEZMBcGA1UEAwwQV2FycmVuIFRlc3QgQ0EgMjBZMBMG
ByqGSM49AgEGCCqGSM49AwEHA0IABFxvxm3igcC6M8PIP5yDEr1qWbl1z1+FAQF2
zamiK8d4cifDEkE/fGjCVS0ZWShAjDFSmaSRodu8YIej38sjfqyjYzBhMB0GA1Ud
DgQWBBTgnKDcdBqpHBbQ62HFvv3ayIFLlDAfBgNVHSMEGDAWgBTgnKDcdBqpHBbQ
62HFvv3ayIFLlDAPBgNVHRMBAf8EBTADAQH/MA4GA1UdDwEB/wQEAwIBBjAKBggq
hkjOPQQDAgNIADBFAiEA+nMycttzSnlz+icF+gfJW/xA+T8zqN6BAIuQWn67O+EC
IDYAlthHUXmGBWCoonkNrThW6hLyM/gVIUDx5p1loZEB
-----END CERTIFICATE-----
`;

/** Minimal SAML IdP metadata: an EntityDescriptor with an IDPSSODescriptor. */
export const IDP_METADATA = `<?xml version="1.0" encoding="UTF-8"?>
<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" entityID="https://idp.example.com/metadata">
  <md:IDPSSODescriptor protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol">
    <md:NameIDFormat>urn:oasis:names:tc:SAML:2.0:nameid-format:persistent</md:NameIDFormat>
    <md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect" Location="https://idp.example.com/sso"/>
  </md:IDPSSODescriptor>
</md:EntityDescriptor>
`;

/** A short random lowercase label, for hostnames that must be unique. */
export function rand(n = 8): string {
  return randomBytes(n).toString('hex').slice(0, n);
}

/** RFC 3339, UTC, whole seconds (wire-conventions.md §6). */
export const RFC3339 = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/;

/** `<prefix>_<27 base62>` */
export function idRe(prefix: string): RegExp {
  return new RegExp(`^${prefix}_[0-9A-Za-z]{27}$`);
}
