import { z } from 'zod';

/**
 * The stored target JSON (column event_destinations.target; shapes from the control plane's
 * event-destinations.target.ts, secrets included), checked before use: a destination whose
 * stored target does not parse gets a target that answers `auth` (the destination pauses until
 * it is fixed by a PATCH) instead of throwing.
 */

const awsAuth = z.object({
  role: z.object({ role_arn: z.string().min(1) }).nullable().optional(),
  creds: z.object({ aws_access_key_id: z.string().min(1), aws_secret_access_key: z.string().min(1) }).nullable().optional(),
}).refine((a) => !!a.role || !!a.creds, { message: 'auth needs role or creds' });

export const firehoseSchema = z.object({ auth: awsAuth, delivery_stream_arn: z.string().min(1) });
export const kinesisSchema = z.object({ auth: awsAuth, stream_arn: z.string().min(1) });
export const cloudwatchLogsSchema = z.object({ auth: awsAuth, log_group_arn: z.string().min(1) });
export const datadogSchema = z.object({
  api_key: z.string().min(1),
  ddtags: z.string().nullish(),
  service: z.string().nullish(),
  ddsite: z.string().nullish(),
});
export const azureSchema = z.object({
  tenant_id: z.string().min(1),
  client_id: z.string().min(1),
  client_secret: z.string().min(1),
  logs_ingestion_uri: z.string().url(),
  data_collection_rule_id: z.string().min(1),
  data_collection_stream_name: z.string().min(1),
});

export type FirehoseConfig = z.infer<typeof firehoseSchema>;
export type KinesisConfig = z.infer<typeof kinesisSchema>;
export type CloudwatchLogsConfig = z.infer<typeof cloudwatchLogsSchema>;
export type DatadogConfig = z.infer<typeof datadogSchema>;
export type AzureConfig = z.infer<typeof azureSchema>;

/** Parses a stored target; the error names fields only, never values (they may be secrets). */
export function parseStored<T>(schema: z.ZodType<T>, value: unknown): T {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const fields = r.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
  throw new Error(`invalid stored target: ${fields}`);
}
