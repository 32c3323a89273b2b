export { OutboxRelay, CONFIG_CHANNEL, type OutboxRelayOptions, type RelayProducer } from './relay.js';
export { createRelayMetrics, type RelayMetrics } from './metrics.js';
