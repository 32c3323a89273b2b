/**
 * Local test receivers ("fakes") for the five event targets of docs/event-delivery.md: the AWS
 * fake (Firehose, Kinesis, CloudWatch Logs, STS; SigV4 verified with aws4), the Datadog logs
 * intake and the Azure identity + Logs Ingestion endpoints over HTTPS. See each module's header.
 */
export { AWS_LIMITS, startAwsFake, type AssumeRoleCall, type AwsFake, type AwsFakeOptions, type AwsOp, type AwsRequestRecord, type Fault } from './aws.js';
export { DATADOG_LIMITS, startDatadogFake, type DatadogEntry, type DatadogFake, type DatadogFault, type DatadogRequestRecord } from './datadog.js';
export { AZURE_LIMITS, startAzureFake, type AzureFake, type AzureFault, type AzureRequestRecord } from './azure.js';
export { verifySigV4, type SigV4FailureKind, type SigV4Identity, type SigV4Result } from './sigv4.js';
