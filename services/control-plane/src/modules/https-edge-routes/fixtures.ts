import { generateKeyPairSync } from 'node:crypto';

/** Request bodies shared by the route tests. */

export const IDP_METADATA = `<?xml version="1.0" encoding="UTF-8"?>
<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" entityID="https://idp.example.com/saml">
  <md:IDPSSODescriptor protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol">
    <md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect" Location="https://idp.example.com/sso"/>
  </md:IDPSSODescriptor>
</md:EntityDescriptor>
`;

export const SENDGRID_KEY = generateKeyPairSync('ec', { namedCurve: 'prime256v1' }).publicKey.export({ type: 'spki', format: 'der' }).toString('base64');
export const RSA_KEY = generateKeyPairSync('rsa', { modulusLength: 1024 }).publicKey.export({ type: 'spki', format: 'der' }).toString('base64');

export const RATE_LIMIT_POLICY = `inbound:
  - name: per-ip
    actions:
      - type: rate-limit
        config:
          name: per-ip
          algorithm: sliding_window
          capacity: 100
          rate: 60s
          bucket_key: [conn.client_ip]
`;

/** Every module except the auth ones and the referencing ones, in request shape. */
export const PLAIN_MODULES = {
  circuit_breaker: { tripped_duration: 10, rolling_window: 10, num_buckets: 10, volume_threshold: 20, error_threshold_percentage: 0.5 },
  compression: {},
  request_headers: { add: { 'X-Req': 'a' }, remove: ['X-Drop'] },
  response_headers: { enabled: false, add: {}, remove: [] },
  webhook_verification: { provider: 'GitHub', secret: 'whsec' },
  websocket_tcp_converter: { enabled: true },
  user_agent_filter: { allow: ['(?i)curl/.*'], deny: ['bot'] },
  traffic_policy: { value: RATE_LIMIT_POLICY },
};
