// A Node udskit server on tls:127.0.0.1:0 for the Python TLS interop test:
// node tls-server.mjs DIST CERT KEY CA ALLOWED_SPIFFE_ID; prints its address, serves "who".
import fs from 'node:fs';
const [dist, cert, key, ca, allowed] = process.argv.slice(2);
const { createServer } = await import(dist);
const srv = createServer({ handlers: { who: (_req, ctx) => ({ spiffe_id: ctx.peer?.spiffeId ?? null }) } });
const addr = await srv.listen('tls:127.0.0.1:0', {
  tls: { cert: fs.readFileSync(cert), key: fs.readFileSync(key), ca: fs.readFileSync(ca), allowSpiffe: [allowed] },
});
console.log(addr);
process.on('SIGTERM', () => { srv.close().then(() => process.exit(0)); });
