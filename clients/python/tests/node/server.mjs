// Node server half of tests/test_node_interop.py: the demo methods, served by the
// Node package at argv[2] on argv[3]; prints "listening ADDR"; SIGTERM drains.
import { pathToFileURL } from 'node:url';

const { createServer, raw, stream, UdskitError } = await import(pathToFileURL(process.argv[2]).href);
const s = createServer({
  handlers: {
    echo: raw((req) => req),
    sleep: async (req) => { await new Promise((r) => setTimeout(r, req.ms)); return { slept_ms: req.ms }; },
    fail: (req) => { throw new UdskitError(req.code, req.message); },
    stream: stream(async function* (req) { for (let i = 0; i < req.n; i++) yield { i, n: req.n }; }),
  },
});
console.log('listening', await s.listen(process.argv[3]));
process.on('SIGTERM', async () => { await s.shutdown(); process.exit(0); });
