// Simulated ingress nodes for snapshot-memory.int.test.ts, in a child process of their own so that
// what they receive and buffer does not count in the control plane's (the test process's) memory.
//
// Parent → child (IPC): {connect: {target, nodes: [{nodeId, parts}]}}, {resume: true}, {exit: true}.
// Child → parent: {paused: n} once every node of the last `connect` holds its first snapshot
// message (and then reads no more: HTTP/2 flow control holds the control plane back), and
// {done: [...]} once every node has read its whole snapshot after a `resume`; {report: [...]}, what
// every node received so far, when asked with {report: true}.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { fileURLToPath } from 'node:url';

const PROTO_DIR = fileURLToPath(new URL('../../../../proto', import.meta.url));
const def = protoLoader.loadSync('warren/config/v1/config.proto', { keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true, includeDirs: [PROTO_DIR] });
const Service = grpc.loadPackageDefinition(def).warren.config.v1.ConfigService;

const nodes = [];

function connect(target, spec) {
  const client = new Service(target, grpc.credentials.createInsecure(), { 'grpc.max_receive_message_length': -1 });
  const call = client.Connect(new grpc.Metadata());
  const n = { seq: '', spec, client, call, parts: [], error: null, first: false, done: false, credentials: 0, tunnels: 0, version: 0, epoch: '', after: [] };
  call.on('data', (m) => {
    // The order of what arrives: s(napshot part), d(elta), t(unnels), h(eartbeat), w(elcome).
    n.seq += { snapshot: 's', delta: 'd', tunnels: 't', heartbeat: 'h', welcome: 'w' }[m.msg] ?? '?';
    if (m.msg === 'snapshot') {
      const s = m.snapshot;
      if (n.done) n.after.push({ msg: 'snapshot', version: Number(s.version) });
      else {
        n.parts.push({ part: s.part, more: s.more, version: Number(s.version) });
        n.credentials += s.resources?.credentials?.length ?? 0;
        n.tunnels += s.remoteTunnels?.length ?? 0;
        n.version = Number(s.version);
        n.epoch = s.epoch;
        if (!s.more) n.done = true;
      }
      if (!n.first) {
        n.first = true;
        call.pause();
        report();
      }
      if (n.done) report();
    } else if (m.msg === 'delta') {
      n.after.push({ msg: 'delta', from: Number(m.delta.fromVersion), version: Number(m.delta.version) });
    }
  });
  call.on('error', (e) => {
    clearInterval(n.keepAlive);
    n.error = e.message;
    n.first = true;
    report();
  });
  call.write({ hello: { nodeId: spec.nodeId, nodeAddress: '127.0.0.1:9', parts: spec.parts } });
  // Keep-alives as a node sends them (the control plane ends a silent stream after its lease).
  n.keepAlive = setInterval(() => call.write({ keepAlive: {} }), spec.keepAliveMs ?? 300);
  n.keepAlive.unref();
  nodes.push(n);
}

let resumed = false;
function results() {
  return nodes.map((n) => ({ nodeId: n.spec.nodeId, seq: n.seq, parts: n.parts, credentials: n.credentials, tunnels: n.tunnels, version: n.version, epoch: n.epoch, error: n.error, after: n.after }));
}

function report() {
  if (!resumed && nodes.every((n) => n.first)) process.send({ paused: nodes.length });
  if (resumed && nodes.every((n) => n.done || n.error)) {
    process.send({ done: results() });
  }
}

process.on('message', (msg) => {
  if (msg.connect) {
    for (const spec of msg.connect.nodes) connect(msg.connect.target, spec);
  } else if (msg.resume) {
    resumed = true;
    for (const n of nodes) n.call.resume();
    report();
  } else if (msg.report) {
    process.send({ report: results() });
  } else if (msg.exit) {
    for (const n of nodes) n.client.close();
    process.exit(0);
  }
});
process.send({ ready: true });
