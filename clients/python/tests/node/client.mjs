// Node client half of tests/test_node_interop.py: calls every demo method of the
// server at argv[3] with the Node package at argv[2] and prints one JSON line.
import { pathToFileURL } from 'node:url';

const { connect } = await import(pathToFileURL(process.argv[2]).href);
const c = await connect(process.argv[3], { timeout: 5000 });
const out = { pid: process.pid };
out.echo = await c.call('echo', { hi: 1 });
out.raw = Buffer.from(await c.call('echo', Buffer.from([0, 1, 255]))).toString('hex');
out.who = await c.call('whoami');
try { await c.call('fail', { code: 'not_found', message: 'gone' }); } catch (e) { out.fail = [e.code, e.message]; }
try { await c.call('sleep', { ms: 2000 }, { timeout: 100 }); } catch (e) { out.deadline = e.code; }
out.items = [];
for await (const it of c.stream('stream', { n: 3 })) out.items.push(it);
let n = 0;
for await (const _ of c.stream('stream', { n: 30000 })) n++;
out.many = n;
const big = Buffer.alloc(1 << 20, 7);
out.big = Buffer.from(await c.call('echo', big)).equals(big);
const r = await Promise.all(Array.from({ length: 1000 }, (_, i) => c.call('echo', { i })));
out.conc = r.every((x, i) => x.i === i);
await c.close();
console.log(JSON.stringify(out));
