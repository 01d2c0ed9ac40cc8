// The one Stripe fault localstripe cannot produce on demand: a charge Stripe
// makes whose answer never comes back (an upstream timeout after Stripe
// created the charge). Everything is forwarded to localstripe untouched; a
// request whose form body carries metadata[fault]=answer_lost is forwarded
// too, but its answer is withheld until the caller gives up.
// Usage: node stripe_faults.js PORT UPSTREAM_PORT
const http = require('node:http');

const [port, upstreamPort] = process.argv.slice(2).map(Number);
if (!port || !upstreamPort) throw new Error('usage: node stripe_faults.js PORT UPSTREAM_PORT');

http
  .createServer((request, response) => {
    const chunks = [];
    request.on('data', (chunk) => chunks.push(chunk));
    request.on('end', () => {
      const body = Buffer.concat(chunks);
      const upstream = http.request(
        { host: '127.0.0.1', port: upstreamPort, method: request.method, path: request.url, headers: request.headers },
        (answer) => {
          const parts = [];
          answer.on('data', (part) => parts.push(part));
          answer.on('end', () => {
            const lost = new URLSearchParams(body.toString()).get('metadata[fault]') === 'answer_lost';
            if (lost) return; // Stripe made it; the answer is lost.
            response.writeHead(answer.statusCode ?? 502, answer.headers);
            response.end(Buffer.concat(parts));
          });
        },
      );
      upstream.on('error', (error) => response.writeHead(502).end(String(error)));
      upstream.end(body);
    });
  })
  .listen(port, '127.0.0.1');
