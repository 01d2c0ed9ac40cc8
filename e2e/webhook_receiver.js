// A stand-in for a Slack incoming webhook (or any alert endpoint) for the
// browser tests: records every POST it receives and lists them on
// GET /deliveries. Usage: node webhook_receiver.js PORT
const http = require('node:http');

const port = Number(process.argv[2]);
if (!port) throw new Error('usage: node webhook_receiver.js PORT');
const deliveries = [];

http
  .createServer((request, response) => {
    if (request.method === 'GET' && request.url === '/deliveries') {
      response.writeHead(200, { 'content-type': 'application/json' });
      response.end(JSON.stringify(deliveries));
      return;
    }
    if (request.method === 'GET') {
      response.writeHead(200).end('ok');
      return;
    }
    let body = '';
    request.on('data', (chunk) => { body += chunk; });
    request.on('end', () => {
      let json = null;
      try { json = JSON.parse(body); } catch { /* recorded as text */ }
      deliveries.push({ path: request.url, body: json ?? body });
      response.writeHead(200).end('ok');
    });
  })
  .listen(port, '127.0.0.1');
