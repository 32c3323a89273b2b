import { createAzureTarget, AZURE_LIMITS } from './azure.js';
import { createCloudwatchLogsTarget, CLOUDWATCH_LIMITS } from './cloudwatch-logs.js';
import { createDatadogTarget, DATADOG_LIMITS } from './datadog.js';
import { createFirehoseTarget, FIREHOSE_LIMITS } from './firehose.js';
import { createKinesisTarget, KINESIS_LIMITS } from './kinesis.js';
import type { EventRecord, LoadedDestination, SendOutcome, Target, TargetEnv, TargetFactory, TargetLimits } from './types.js';
import { utf8Length } from './util.js';

export type { EventRecord, LoadedDestination, SendOutcome, Target, TargetEnv, TargetFactory, TargetLimits } from './types.js';
export { AZURE_LIMITS, CLOUDWATCH_LIMITS, DATADOG_LIMITS, FIREHOSE_LIMITS, KINESIS_LIMITS };
export { azureRow } from './azure.js';
export { CLOUDWATCH_MAX_AGE_MS, CLOUDWATCH_MAX_FUTURE_MS, CLOUDWATCH_MAX_SPAN_MS } from './cloudwatch-logs.js';

const LIMITS: Record<LoadedDestination['kind'], TargetLimits> = {
  firehose: FIREHOSE_LIMITS,
  kinesis: KINESIS_LIMITS,
  cloudwatch_logs: CLOUDWATCH_LIMITS,
  datadog: DATADOG_LIMITS,
  azure_logs_ingestion: AZURE_LIMITS,
};

/**
 * A target for one destination. Never throws: a stored target that cannot be used (bad ARN,
 * missing field, unknown kind) gives a target whose send() answers `auth` with the reason, so
 * the destination pauses until a PATCH fixes it (and the caller rebuilds the target).
 * Targets hold SDK clients, keep-alive sockets and (Azure, AWS role) cached credentials: cache
 * one per destination, rebuild on update, close() the old one.
 */
export const createTarget: TargetFactory = (dest: LoadedDestination, env: TargetEnv): Target => {
  try {
    switch (dest.kind) {
      case 'firehose':
        return createFirehoseTarget(dest, env);
      case 'kinesis':
        return createKinesisTarget(dest, env);
      case 'cloudwatch_logs':
        return createCloudwatchLogsTarget(dest, env);
      case 'datadog':
        return createDatadogTarget(dest, env);
      case 'azure_logs_ingestion':
        return createAzureTarget(dest, env);
      default:
        throw new Error(`unknown target kind ${String(dest.kind)}`);
    }
  } catch (err) {
    return brokenTarget(dest, `destination ${dest.id} cannot be used: ${(err as Error).message}`);
  }
};

function brokenTarget(dest: LoadedDestination, reason: string): Target {
  const limits = LIMITS[dest.kind] ?? DATADOG_LIMITS;
  return {
    kind: dest.kind,
    limits,
    recordBytes: (r: EventRecord) => utf8Length(r.body) + limits.overheadBytes,
    send: async (): Promise<SendOutcome> => ({ kind: 'auth', reason }),
    close() {},
  };
}
