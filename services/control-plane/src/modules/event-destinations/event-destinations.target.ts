import { AppError } from '@warren/shared';
import { DEFAULT_DATADOG_SITE, TARGET_KINDS, type EventTarget, type EventTargetInput, type TargetKind } from './event-destinations.schema.js';

/**
 * Stored targets: the configured branch only, secrets included (column `target`, kind in
 * `target_kind`). Responses and events get `redact`: every branch key present, secrets "".
 */

export interface StoredAwsAuth {
  role: { role_arn: string } | null;
  creds: { aws_access_key_id: string; aws_secret_access_key: string } | null;
}
export interface StoredFirehose {
  auth: StoredAwsAuth;
  delivery_stream_arn: string;
}
export interface StoredKinesis {
  auth: StoredAwsAuth;
  stream_arn: string;
}
export interface StoredCloudwatchLogs {
  auth: StoredAwsAuth;
  log_group_arn: string;
}
export interface StoredDatadog {
  api_key: string;
  ddtags: string;
  service: string;
  ddsite: string;
}
export interface StoredAzureLogsIngestion {
  tenant_id: string;
  client_id: string;
  client_secret: string;
  logs_ingestion_uri: string;
  data_collection_rule_id: string;
  data_collection_stream_name: string;
}
export interface StoredTargets {
  firehose: StoredFirehose;
  kinesis: StoredKinesis;
  cloudwatch_logs: StoredCloudwatchLogs;
  datadog: StoredDatadog;
  azure_logs_ingestion: StoredAzureLogsIngestion;
}
export type StoredTarget = StoredTargets[TargetKind];

/** The one configured kind of a validated target input. */
export function kindOf(input: EventTargetInput): TargetKind {
  return TARGET_KINDS.find((k) => input[k] != null)!;
}

function secretOrKept(given: string | null | undefined, kept: string | undefined, field: string): string {
  if (given) return given;
  if (kept) return kept;
  throw new AppError(2103, `${field} is required`, { field });
}

type AuthInput = { role?: { role_arn: string } | null; creds?: { aws_access_key_id: string; aws_secret_access_key?: string | null } | null };

function awsAuth(input: AuthInput, previous: StoredAwsAuth | undefined, path: string): StoredAwsAuth {
  if (input.role) return { role: { role_arn: input.role.role_arn }, creds: null };
  const creds = input.creds!;
  return {
    role: null,
    creds: {
      aws_access_key_id: creds.aws_access_key_id,
      aws_secret_access_key: secretOrKept(creds.aws_secret_access_key, previous?.creds?.aws_secret_access_key, `${path}.auth.creds.aws_secret_access_key`),
    },
  };
}

/**
 * The stored form of a validated target. `previous` is the stored target of the same kind on
 * update: secrets omitted or "" keep its values (wire-conventions.md §9); on create a missing
 * secret is 400 (2103).
 */
export function toStored(input: EventTargetInput, previous?: StoredTarget): StoredTarget {
  const kind = kindOf(input);
  const path = `target.${kind}`;
  switch (kind) {
    case 'firehose': {
      const t = input.firehose!;
      return { auth: awsAuth(t.auth, (previous as StoredFirehose | undefined)?.auth, path), delivery_stream_arn: t.delivery_stream_arn } satisfies StoredFirehose;
    }
    case 'kinesis': {
      const t = input.kinesis!;
      return { auth: awsAuth(t.auth, (previous as StoredKinesis | undefined)?.auth, path), stream_arn: t.stream_arn } satisfies StoredKinesis;
    }
    case 'cloudwatch_logs': {
      const t = input.cloudwatch_logs!;
      return { auth: awsAuth(t.auth, (previous as StoredCloudwatchLogs | undefined)?.auth, path), log_group_arn: t.log_group_arn } satisfies StoredCloudwatchLogs;
    }
    case 'datadog': {
      const t = input.datadog!;
      return {
        api_key: secretOrKept(t.api_key, (previous as StoredDatadog | undefined)?.api_key, `${path}.api_key`),
        ddtags: t.ddtags ?? '',
        service: t.service ?? '',
        ddsite: t.ddsite ? t.ddsite.toLowerCase() : DEFAULT_DATADOG_SITE,
      } satisfies StoredDatadog;
    }
    case 'azure_logs_ingestion': {
      const t = input.azure_logs_ingestion!;
      return {
        tenant_id: t.tenant_id,
        client_id: t.client_id,
        client_secret: secretOrKept(t.client_secret, (previous as StoredAzureLogsIngestion | undefined)?.client_secret, `${path}.client_secret`),
        logs_ingestion_uri: t.logs_ingestion_uri,
        data_collection_rule_id: t.data_collection_rule_id,
        data_collection_stream_name: t.data_collection_stream_name,
      } satisfies StoredAzureLogsIngestion;
    }
  }
}

function redactAuth(a: StoredAwsAuth): StoredAwsAuth {
  return {
    role: a.role ? { role_arn: a.role.role_arn } : null,
    creds: a.creds ? { aws_access_key_id: a.creds.aws_access_key_id, aws_secret_access_key: '' } : null,
  };
}

/** The response `target`: all five keys, unused ones null, secrets "". */
export function redact(kind: TargetKind, stored: StoredTarget): EventTarget {
  const out: EventTarget = { firehose: null, kinesis: null, cloudwatch_logs: null, datadog: null, azure_logs_ingestion: null };
  switch (kind) {
    case 'firehose': {
      const t = stored as StoredFirehose;
      out.firehose = { auth: redactAuth(t.auth), delivery_stream_arn: t.delivery_stream_arn };
      break;
    }
    case 'kinesis': {
      const t = stored as StoredKinesis;
      out.kinesis = { auth: redactAuth(t.auth), stream_arn: t.stream_arn };
      break;
    }
    case 'cloudwatch_logs': {
      const t = stored as StoredCloudwatchLogs;
      out.cloudwatch_logs = { auth: redactAuth(t.auth), log_group_arn: t.log_group_arn };
      break;
    }
    case 'datadog': {
      const t = stored as StoredDatadog;
      out.datadog = { api_key: '', ddtags: t.ddtags, service: t.service, ddsite: t.ddsite };
      break;
    }
    case 'azure_logs_ingestion': {
      const t = stored as StoredAzureLogsIngestion;
      out.azure_logs_ingestion = {
        tenant_id: t.tenant_id,
        client_id: t.client_id,
        client_secret: '',
        logs_ingestion_uri: t.logs_ingestion_uri,
        data_collection_rule_id: t.data_collection_rule_id,
        data_collection_stream_name: t.data_collection_stream_name,
      };
      break;
    }
  }
  return out;
}

/** Structural equality of JSON values (jsonb does not keep key order). */
export function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (a === null || b === null || typeof a !== 'object' || typeof b !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a as object);
  const kb = Object.keys(b as object);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => sameJson((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}
