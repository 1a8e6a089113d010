// Node client half of tests/test_bidi_matrix.py: drives `sum` on the server at argv[3]
// with the Node package at argv[2] and prints one JSON line of what it saw:
// running totals, half-close, 1,000 concurrent calls on one connection, a cancel,
// a deadline, and the server failing a call.
import { pathToFileURL } from 'node:url';

const { connect } = await import(pathToFileURL(process.argv[2]).href);
const c = await connect(process.argv[3], { timeout: 5000 });
const out = {};

// one item each way per round, then half-close
let call = c.bidiJSON('sum', { timeoutMs: 10000 });
const it = call[Symbol.asyncIterator]();
out.totals = [];
for (const x of [1, 2, 4.5]) {
  await call.write(x);
  out.totals.push((await it.next()).value);
}
await call.end();
out.after_end = (await it.next()).done;

// 1,000 concurrent calls on one connection
const res = await Promise.all(Array.from({ length: 1000 }, async (_, i) => {
  const b = c.bidiJSON('sum', { timeoutMs: 60000 });
  await b.write(i); await b.write(1); await b.end();
  const got = [];
  for await (const t of b) got.push(t);
  return got[0] === i && got[1] === i + 1 && got.length === 2;
}));
out.concurrent = res.filter(Boolean).length;

// cancel from the client: the reading side fails with canceled
call = c.bidiJSON('sum', { timeoutMs: 10000 });
await call.write(5);
const it2 = call[Symbol.asyncIterator]();
await it2.next();
call.cancel();
try { await it2.next(); out.cancel = 'no error'; } catch (e) { out.cancel = e.code; }

// deadline: no item, no end: the server waits until the deadline ends the call
call = c.bidiJSON('sum', { timeoutMs: 200 });
try { for await (const _ of call) { /* none */ } out.deadline = 'no error'; } catch (e) { out.deadline = e.code; }

// the server ends the call with an error; later writes say false
call = c.bidiJSON('sum', { timeoutMs: 10000 });
await call.write('x');
try { for await (const _ of call) { /* none */ } out.server_error = 'no error'; } catch (e) { out.server_error = e.code; }
out.write_after_end = await call.write(1);

// client-streaming: the one response after end()
const up = c.clientStreamJSON('total', { timeoutMs: 10000 });
for (const x of [1, 2, 4.5]) await up.write(x);
out.total = await up.end();

out.echo = Buffer.from(await c.call('echo', Buffer.from('still'))).toString();
await c.close();
console.log(JSON.stringify(out));
