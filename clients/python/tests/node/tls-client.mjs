// The Node client on tls: for the Python TLS interop test:
// node tls-client.mjs DIST ADDR CERT KEY CA; prints the "who" answer as JSON.
import fs from 'node:fs';
const [dist, addr, cert, key, ca] = process.argv.slice(2);
const { connect } = await import(dist);
const c = await connect(addr, { tls: { ca: fs.readFileSync(ca), cert: fs.readFileSync(cert), key: fs.readFileSync(key) }, reconnect: false });
console.log(JSON.stringify(await c.call('who', {})));
await c.close();
