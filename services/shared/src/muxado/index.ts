/** muxado (stream multiplexing) and the typed-stream agent protocol on top of it. */
export * from './frame.js';
export * from './errors.js';
export * from './writer.js';
export * from './stream.js';
export * from './session.js';
export * from './typed.js';
export * from './heartbeat.js';
export * from './agent-messages.js';
