// Node server half of tests/test_bidi_matrix.py: the demo's echo, the bidi `sum`
// (each JSON number in, the running total out) and the client-streaming `total`
// (their sum, once at the end); a non-number fails the call with invalid_argument. Served by the Node package at argv[2] on argv[3];
// prints "listening ADDR"; SIGTERM drains.
import { pathToFileURL } from 'node:url';

const { createServer, raw, bidi, clientStream, UdskitError } = await import(pathToFileURL(process.argv[2]).href);
const number = (method, n) => {
  if (typeof n !== 'number') throw new UdskitError('invalid_argument', `${method}: item ${JSON.stringify(n)} is not a JSON number`);
  return n;
};
const s = createServer({
  handlers: {
    echo: raw((req) => req),
    sum: bidi(async function* (requests) {
      let total = 0;
      for await (const n of requests) {
        total += number('sum', n);
        yield total;
      }
    }),
    total: clientStream(async (requests) => {
      let total = 0;
      for await (const n of requests) total += number('total', n);
      return total;
    }),
  },
});
console.log('listening', await s.listen(process.argv[3]));
process.on('SIGTERM', async () => { await s.shutdown(); process.exit(0); });
