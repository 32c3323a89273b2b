import { z } from 'zod';
import { boundedString, description, metadata, obj } from '../../http/validate.js';

/** Target kinds, in the order the response lists them. */
export const TARGET_KINDS = ['firehose', 'kinesis', 'cloudwatch_logs', 'datadog', 'azure_logs_ingestion'] as const;
export type TargetKind = (typeof TARGET_KINDS)[number];

export const DATADOG_SITES = ['datadoghq.com', 'us3.datadoghq.com', 'us5.datadoghq.com', 'datadoghq.eu', 'ap1.datadoghq.com', 'ap2.datadoghq.com', 'ddog-gov.com', 'us2.ddog-gov.com', 'uk1.datadoghq.com'] as const;
export const DEFAULT_DATADOG_SITE = 'datadoghq.com';

// ---------------------------------------------------------------------------------------------
// ARNs: arn:partition:service:region:account:resource, with the target's own service.

interface ArnRule {
  service: string;
  region: boolean;
  resource: RegExp;
  example: string;
}

const ARN_RULES = {
  firehose: { service: 'firehose', region: true, resource: /^deliverystream\/[A-Za-z0-9_.-]{1,64}$/, example: 'arn:aws:firehose:us-east-1:123456789012:deliverystream/name' },
  kinesis: { service: 'kinesis', region: true, resource: /^stream\/[A-Za-z0-9_.-]{1,128}$/, example: 'arn:aws:kinesis:us-east-1:123456789012:stream/name' },
  logs: { service: 'logs', region: true, resource: /^log-group:[A-Za-z0-9_.\-/#]{1,512}(:\*)?$/, example: 'arn:aws:logs:us-east-1:123456789012:log-group:name' },
  iam: { service: 'iam', region: false, resource: /^role(\/[A-Za-z0-9_+=,.@-]+)*\/[A-Za-z0-9_+=,.@-]{1,64}$/, example: 'arn:aws:iam::123456789012:role/name' },
} satisfies Record<string, ArnRule>;

/** The reason `arn` does not fit `rule`, or undefined when it does. */
export function arnProblem(arn: string, rule: ArnRule): string | undefined {
  const parts = arn.split(':');
  if (parts.length < 6 || parts[0] !== 'arn') return `not an ARN; expected e.g. ${rule.example}`;
  const [, partition, service, region, account] = parts as [string, string, string, string, string];
  const resource = parts.slice(5).join(':');
  if (!/^aws(-[a-z]+)*$/.test(partition)) return `unknown ARN partition ${JSON.stringify(partition.slice(0, 32))}`;
  if (service !== rule.service) return `expected an ARN of service ${rule.service}, got ${JSON.stringify(service.slice(0, 32))}; e.g. ${rule.example}`;
  if (rule.region && !/^[a-z]{2}(-[a-z]+)+-\d{1,2}$/.test(region)) return region ? `invalid region ${JSON.stringify(region.slice(0, 32))} in the ARN` : 'the ARN must name a region';
  if (!rule.region && region !== '') return `a ${rule.service} ARN has no region; e.g. ${rule.example}`;
  if (!/^\d{12}$/.test(account)) return 'the ARN must name a 12-digit account id';
  if (!rule.resource.test(resource)) return `invalid resource ${JSON.stringify(resource.slice(0, 64))} in the ARN; e.g. ${rule.example}`;
  return undefined;
}

const arn = (rule: ArnRule) =>
  boundedString(2048, 5003, 'ARN')
    .superRefine((s, ctx) => {
      const problem = arnProblem(s, rule);
      if (problem) ctx.addIssue({ code: 'custom', message: problem, params: { code: 6501 } });
    })
    .describe(`ARN, e.g. ${rule.example}`);

/** A string that must not be empty (2103 when it is). */
const required = (max: number, what: string) =>
  boundedString(max, 5003, what).refine((s) => s !== '', { message: `${what} is required`, params: { code: 2103 } });

/** A secret: required on create, but in an update of the same kind omitted or "" keeps the stored one. */
const secret = (max: number, what: string) => boundedString(max, 5003, what).nullish().describe('secret; returned as ""; omitted or "" in an update keeps the stored value');

/** Refines an object whose listed keys are branches: exactly one must be non-null (2105). */
function exactlyOne<T extends Record<string, unknown>>(keys: readonly (keyof T & string)[], what: string) {
  return (o: T, ctx: z.core.$RefinementCtx<T>) => {
    const set = keys.filter((k) => o[k] != null);
    if (set.length !== 1)
      ctx.addIssue({
        code: 'custom',
        message: set.length === 0 ? `${what} must configure exactly one of ${keys.join(', ')}` : `${what} must configure only one of ${set.join(', ')}`,
        params: { code: 2105 },
      });
  };
}

// ---------------------------------------------------------------------------------------------
// Requests

const AwsRole = obj({ role_arn: arn(ARN_RULES.iam) });
const AwsCreds = obj({ aws_access_key_id: required(128, 'aws_access_key_id'), aws_secret_access_key: secret(1024, 'aws_secret_access_key') });
const AwsAuth = obj({ role: AwsRole.nullish(), creds: AwsCreds.nullish() }).superRefine(exactlyOne(['role', 'creds'], 'auth'));

const Firehose = obj({ auth: AwsAuth, delivery_stream_arn: arn(ARN_RULES.firehose) });
const Kinesis = obj({ auth: AwsAuth, stream_arn: arn(ARN_RULES.kinesis) });
const CloudwatchLogs = obj({ auth: AwsAuth, log_group_arn: arn(ARN_RULES.logs) });
const Datadog = obj({
  api_key: secret(256, 'api_key'),
  ddtags: boundedString(4096, 5003, 'ddtags').nullish(),
  service: boundedString(255, 5003, 'service').nullish(),
  ddsite: boundedString(64, 5003, 'ddsite')
    .nullish()
    .refine((s) => !s || (DATADOG_SITES as readonly string[]).includes(s.toLowerCase()), { message: `ddsite must be one of ${DATADOG_SITES.join(', ')}` })
    .describe(`Datadog site; empty means ${DEFAULT_DATADOG_SITE}`),
});
const AzureLogsIngestion = obj({
  tenant_id: required(256, 'tenant_id'),
  client_id: required(256, 'client_id'),
  client_secret: secret(1024, 'client_secret'),
  logs_ingestion_uri: required(2048, 'logs_ingestion_uri').refine(
    (s) => {
      try {
        const u = new URL(s);
        return u.protocol === 'https:' && u.hostname !== '';
      } catch {
        return false;
      }
    },
    { message: 'logs_ingestion_uri must be an https URL', params: { code: 6500 } },
  ),
  data_collection_rule_id: required(256, 'data_collection_rule_id'),
  data_collection_stream_name: required(256, 'data_collection_stream_name'),
});

export const EventTargetInput = obj({
  firehose: Firehose.nullish(),
  kinesis: Kinesis.nullish(),
  cloudwatch_logs: CloudwatchLogs.nullish(),
  datadog: Datadog.nullish(),
  azure_logs_ingestion: AzureLogsIngestion.nullish(),
}).superRefine(exactlyOne(TARGET_KINDS, 'target'));
export type EventTargetInput = z.output<typeof EventTargetInput>;

const format = () =>
  z
    .string()
    .nullish()
    .refine((s) => s == null || s.toLowerCase() === 'json', { message: 'format must be json' })
    .describe('json (case-insensitive); stored and returned as json');

export const EventDestinationCreate = obj({
  description: description().nullish(),
  metadata: metadata().nullish(),
  format: format(),
  target: EventTargetInput,
});

export const EventDestinationUpdate = obj({
  id: z.string().nullish().describe('ignored; sent by the official clients'),
  description: description().nullish(),
  metadata: metadata().nullish(),
  format: format(),
  target: EventTargetInput.nullish().describe('replaces the whole target; the kind cannot change'),
});

// ---------------------------------------------------------------------------------------------
// Responses

const AwsAuthResponse = z.object({
  role: z.object({ role_arn: z.string() }).nullable(),
  creds: z.object({ aws_access_key_id: z.string(), aws_secret_access_key: z.string() }).nullable(),
});

export const EventTargetResponse = z.object({
  firehose: z.object({ auth: AwsAuthResponse, delivery_stream_arn: z.string() }).nullable(),
  kinesis: z.object({ auth: AwsAuthResponse, stream_arn: z.string() }).nullable(),
  cloudwatch_logs: z.object({ auth: AwsAuthResponse, log_group_arn: z.string() }).nullable(),
  datadog: z.object({ api_key: z.string(), ddtags: z.string(), service: z.string(), ddsite: z.string() }).nullable(),
  azure_logs_ingestion: z
    .object({
      tenant_id: z.string(),
      client_id: z.string(),
      client_secret: z.string(),
      logs_ingestion_uri: z.string(),
      data_collection_rule_id: z.string(),
      data_collection_stream_name: z.string(),
    })
    .nullable(),
});
export type EventTarget = z.infer<typeof EventTargetResponse>;

export const EventDestinationResponse = z.object({
  id: z.string(),
  uri: z.string(),
  created_at: z.string(),
  description: z.string().optional(),
  metadata: z.string().optional(),
  format: z.literal('json'),
  target: EventTargetResponse,
});
export type EventDestination = z.infer<typeof EventDestinationResponse>;

export const EventDestinationList = z.object({ event_destinations: z.array(EventDestinationResponse), uri: z.string(), next_page_uri: z.string().nullable() });
