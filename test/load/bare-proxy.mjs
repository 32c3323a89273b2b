// The proxy bench's yardstick (case n): the least a Node.js reverse proxy does per request, so
// the ingress can be compared with what Node's HTTP server and undici cost by themselves on the
// same box and pinning. node:http in front, one undici Pool (64 keep-alive connections,
// pipelining 1) behind, raw headers passed as they are, dispatch handlers writing straight to the
// response: no routing, no TLS link to an agent, no policy, no metrics. Plain JavaScript, run by
// node itself (no tsx transform), so nothing of ours is in its cost.
//
//   node test/load/bare-proxy.mjs <upstream port> <listen port>
import http from 'node:http';
import { Pool } from 'undici';

const [upstreamPort, port] = process.argv.slice(2).map(Number);
const pool = new Pool(`http://127.0.0.1:${upstreamPort}`, { connections: 64, pipelining: 1 });

const server = http.createServer((req, res) => {
  pool.dispatch(
    { path: req.url, method: req.method, headers: req.rawHeaders, body: req.method === 'GET' || req.method === 'HEAD' ? null : req },
    {
      onConnect(abort) {
        // A client that goes away mid-response (wrk stopping) must free the upstream connection:
        // a paused request (res.write returned false) would otherwise wait for a 'drain' that
        // never comes, and after a few runs every pooled connection was stuck that way.
        res.once('close', () => {
          if (!res.writableFinished) abort(new Error('client closed'));
        });
      },
      onError(err) {
        if (res.headersSent) res.destroy();
        else {
          res.statusCode = 502;
          res.end(String(err.message));
        }
      },
      onHeaders(status, raw, resume) {
        const headers = [];
        for (let i = 0; i < raw.length; i += 2) {
          const name = raw[i].toString('latin1');
          if (name.length === 10 && name.toLowerCase() === 'connection') continue;
          headers.push(name, raw[i + 1].toString('latin1'));
        }
        res.writeHead(status, headers);
        res.on('drain', resume);
        return true;
      },
      onData(chunk) {
        return res.write(chunk);
      },
      onComplete() {
        res.end();
      },
    },
  );
});
server.listen(port, '127.0.0.1');
process.on('SIGTERM', () => {
  server.close();
  server.closeAllConnections();
  void pool.close();
});
