// A newline-JSON client written the way seed 002's Node library is:
// net.createConnection, a readline line splitter, an id counter and a map of
// pending requests with a client-side timeout. It uses Node's standard
// library only. Usage: node ndjson_client.js SOCKET_PATH
// It runs a fixed script of calls against udskit's rpc server and prints one
// JSON result per call, then "done".
'use strict';
const net = require('net');
const readline = require('readline');

const sockPath = process.argv[2];
const maxRequests = Math.pow(2, 17) - 1;
const requests = Array.from({ length: maxRequests });
const DEFAULT_REQUEST_TIMEOUT_MS = 5000;
let currentId = 0;
let client;
let rl;

const createClient = () => new Promise((resolve, reject) => {
  client = net.createConnection({ path: sockPath });
  client.on('connect', resolve);
  client.on('error', reject);
  rl = readline.createInterface({ input: client, crlfDelay: Infinity });
  rl.on('line', (line) => {
    const msg = JSON.parse(line);
    const req = requests[msg.id];
    if (!req) return;
    clearTimeout(req.timeout);
    requests[msg.id] = null;
    if (msg.error) req.reject(new Error(msg.error));
    else req.resolve(msg.data);
  });
});

const sendRequest = (func, data, timeout = DEFAULT_REQUEST_TIMEOUT_MS) => {
  currentId = (currentId + 1) % maxRequests;
  return new Promise((resolve, reject) => {
    client.write(`${JSON.stringify({ id: currentId, func, data })}\n`);
    ((currentId) => {
      requests[currentId] = {
        resolve,
        reject,
        timeout: setTimeout(() => {
          requests[currentId].reject(new Error('Request to sidecar timed out'));
          requests[currentId] = null;
        }, timeout),
      };
    })(currentId);
  });
};

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');

(async () => {
  await createClient();
  // One call, as in the article.
  out({ call: 'getService', data: await sendRequest('getService', { service: 'barista' }) });
  // Errors come back at once as rejections.
  try { await sendRequest('noSuchFunc', {}); } catch (e) { out({ call: 'noSuchFunc', error: e.message }); }
  try { await sendRequest('getService', { service: '' }); } catch (e) { out({ call: 'getService-empty', error: e.message }); }
  // 200 concurrent calls, answered out of order, matched by id.
  const n = 200;
  const all = await Promise.all(Array.from({ length: n }, (_, i) =>
    sendRequest('slowEcho', { i, ms: (n - i) % 7 })));
  out({ call: 'slowEcho', ok: all.every((d, i) => d.i === i), n: all.length });
  client.end();
  out({ done: true });
})().catch((e) => { out({ fatal: e.message }); process.exit(1); });
